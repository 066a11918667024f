"""`twinstep train`: run a training config on a backend (docs/contract.md §5).

    twinstep train [CONFIG] --backend torch|jax --out DIR [--resume] [--set section.key=VALUE ...]
    torchrun --nproc_per_node 2 -m conformance train CONFIG --backend torch --out DIR   # DDP

No CONFIG = the built-in default (binary_blobs, the seeds' MLP, AdamW; seconds on a laptop CPU).
The backend's `ref_<backend>.trainer.train(config, out_dir, resume=..., rank=..., world_size=...,
progress=..., events=...)` does the work; this module only parses arguments and prints a summary line.

A run whose last loss or final parameters are non-finite is not a success: with
`precision.on_nonfinite = "skip"` the summary says how many updates were skipped (exit 0 when only
the last loss is non-finite: the policy skipped those updates as asked), and non-finite final
parameters (an update that overflowed them, lr = 1e308) are an error naming the parameter, exit 2.
SIGTERM / SIGINT: the run saves and stops (conformance.run.preempt); the CLI prints where, exit
143 / 130. SIGTERM during start-up stops with one line saying nothing was trained (143); after the
run has finished and saved it is ignored (the work is done: exit 0).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.config import load_config
from conformance.errors import NonFiniteError, Preempted, TwinstepError, UnsupportedError
from conformance.events import Events
from conformance.harness.backends import PACKAGES
from conformance.rules.inputs import first_nonfinite
from conformance.run.metrics import read_metrics

FRAMEWORKS = tuple(b for b in PACKAGES if b != "oracle")
FRAMEWORK_MODULES = ("torch", "jax", "jaxlib", "optax", "flax")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="train a config (torch or jax) into an output directory",
                       description="Train CONFIG (default: the built-in default) and write DIR/config.toml, "
                                   "DIR/metrics.jsonl and DIR/checkpoints/. --resume continues from the newest "
                                   "complete checkpoint; the continued run equals the uninterrupted one.")
    p.add_argument("config", nargs="?", help="a TOML config file (omit for the built-in default)")
    p.add_argument("--backend", choices=FRAMEWORKS, default="torch", help="framework to train with (default: torch)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in DIR")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (VALUE in TOML syntax; repeatable)")
    p.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default=None,
                   help="progress display (default: run.progress)")
    p.set_defaults(run=run)


def trainer(backend: str) -> Any:
    """The backend's `train` function (UnsupportedError if that backend has no trainer yet)."""
    name = f"{PACKAGES[backend]}.trainer"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name in (name, PACKAGES[backend]):
            raise UnsupportedError(f"backend {backend!r} has no trainer yet ({name} is missing)") from None
        if exc.name in FRAMEWORK_MODULES:
            raise UnsupportedError(f"backend {backend!r} needs the {exc.name} package, which is not installed "
                                   f"in this Python ({sys.executable})") from None
        raise
    return module.train


class Outside:
    """SIGTERM where the run's own handling (conformance.run.preempt, installed while the run is
    open) is not: during start-up nothing has been trained, so the command stops with one line
    (143); once the run has finished and saved, the work is done and the command ends as it would
    have (0)."""

    def __init__(self) -> None:
        self.done = False

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.done:
            raise Preempted(f"stopped by {signal.Signals(signum).name} during start-up; nothing was trained",
                            signal=signum, updates_done=0)


def run(args: argparse.Namespace, events: Events | None = None) -> int:
    outside = Outside()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, outside) if main_thread else None
    try:
        config = load_config(args.config, args.overrides)
        train = trainer(args.backend)
        result = train(config, args.out, resume=args.resume, progress=args.progress, events=events)
        outside.done = True
        return _finish(config, result)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _finish(config: Any, result: Any) -> int:
    """The summary line of a finished run (or an error for non-finite results)."""
    if getattr(result, "out_dir", None) is None or not _is_main():
        return 0
    check_finite(result.params)
    skipped = _skipped(result.out_dir / "metrics.jsonl")
    last = result.losses[-1] if result.losses else None
    if last is not None and not math.isfinite(last) and config.precision.on_nonfinite != "skip":
        raise NonFiniteError(f"the run ended with a non-finite loss ({last}) at update {result.updates_done - 1}")
    where = f"; checkpoint {result.checkpoint}" if result.checkpoint else ""
    loss = f", last loss {last:.6g}" if last is not None else ""
    skips = f", {skipped} of {result.updates_done} updates skipped (non-finite)" if skipped else ""
    print(f"twinstep: trained {result.updates_done} updates{loss}{skips}; metrics in "
          f"{result.out_dir / 'metrics.jsonl'}{where}", file=sys.stderr)
    return 0


def check_finite(params: Mapping[str, Any]) -> None:
    """Refuse a run that ends with non-finite parameters (NonFiniteError naming the first one)."""
    name = first_nonfinite(params)
    if name is not None:
        raise NonFiniteError(f"the run ended with non-finite parameter {name!r} (an update overflowed it: "
                             f"lower optimizer.lr or clip the gradients)")


def _skipped(path: Path) -> int:
    try:
        return sum(1 for r in read_metrics(path) if r.get("event") == "update" and r.get("skipped"))
    except TwinstepError:
        return 0


def _is_main() -> bool:
    return os.environ.get("RANK", "0") == "0"
