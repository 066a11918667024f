"""`twinstep drift CONFIG`: do the torch and JAX runs of a config differ by more than rounding
explains? (conformance/run/drift.py has the method, docs/drift.md the measurements)

    twinstep drift configs/gpt_tiny.toml --updates 200 --seeds 2 --dtype float32 -o drift-gpt
    twinstep drift configs/gpt_tiny.toml --jax-set optimizer.lr=0.00303      # how a real difference looks

Trains the twins (torch and JAX from the same initial weights), per seed each framework again with
rounding-sized changes, and each framework's float64 run (the twins' rounding errors): 4 + 2K runs
of `twinstep train`, in at most `--jobs` worker processes that each train a chain of one framework's
runs (conformance/cli/drift_runs.py; 2 + 2K runs for a float64 config). Prints the weights' distance of the twins against the floor at the saved updates and the
verdict; writes DIR/drift.json (every series), DIR/drift.png (the curves) and DIR/runs/ (the runs,
each with its log). `--set` changes both sides, `--torch-set` / `--jax-set` one side only (its
self-runs too). Exit status: 0 inside the envelope, 1 outside, 2 for bad input or a failed run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from conformance.checkpoint.files import save_tensors
from conformance.cli.conform import default_jobs, whole_number
from conformance.cli.drift_runs import Planned, train_all
from conformance.config import Config, load_config
from conformance.errors import ConfigError
from conformance.run.drift import (
    FRAMEWORKS,
    MULTIPLE,
    Envelope,
    master_dtype,
    measure,
    nudge_lr,
    nudge_weights,
)

POINTS = 20  # saved updates per run: the weights are compared where the runs saved checkpoints
DTYPES = ("float64", "float32", "bfloat16", "float16")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("drift", help="measure whether the torch and JAX runs of a config differ by more than rounding",
                       description="Train CONFIG on both trainers from the same initial weights, each trainer "
                                   "again with rounding-sized changes and once in float64 (its rounding error); "
                                   "compare the twins' distance with that floor. Exit 0 inside the envelope, 1 "
                                   "outside.")
    p.add_argument("config", help="a TOML config of a built-in model")
    p.add_argument("--updates", type=whole_number("updates"), default=200, metavar="N", help="updates per run (default 200)")
    p.add_argument("--seeds", type=whole_number("seeds"), default=2, metavar="K", help="self-runs per framework (default 2)")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="precision.dtype (default: the config's)")
    p.add_argument("--set", dest="both", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value on both sides (repeatable)")
    p.add_argument("--torch-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value for the torch runs only (repeatable)")
    p.add_argument("--jax-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value for the JAX runs only (repeatable)")
    p.add_argument("-o", "--out", default=None, metavar="DIR",
                   help="output directory, new or empty (default: drift-<config>-<dtype>)")
    p.add_argument("--jobs", type=whole_number("processes"), default=None, metavar="N",
                   help="runs at a time (default: the CPU count)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    every = max(1, args.updates // POINTS)
    common = [f"run.max_updates={args.updates}", "run.eval_every=0", 'run.progress="none"', "run.loggers=[]",
              "run.tensorboard=false", f"checkpoint.every={every}", f"checkpoint.keep_last={args.updates // every + 1}",
              "checkpoint.at_end=true", "checkpoint.keep_best=false",
              *([f'precision.dtype="{args.dtype}"'] if args.dtype else []), *args.both]
    sides = {"torch": common + args.torch_set, "jax": common + args.jax_set}
    configs = {fw: load_config(args.config, sides[fw]) for fw in FRAMEWORKS}
    dtype = configs["torch"].precision.dtype
    out = Path(args.out or f"drift-{Path(args.config).stem}-{dtype}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty directory; choose another -o (nothing was overwritten)")
    plan = _plan(configs, sides, args.seeds, out)
    if dtype != "float64":  # each framework's float64 run: its twin's rounding error (it skips what the twin skipped)
        plan += [Planned(f"{fw}-exact", fw, sides[fw] + [_init(out, "start")], exact_of=fw) for fw in FRAMEWORKS]
    runs = out / "runs"
    trained = train_all(args.config, plan, runs, args.jobs or default_jobs(), default_jobs())
    env = measure({fw: runs / fw for fw in FRAMEWORKS},
                  {fw: [runs / f"{fw}-seed{k}" for k in range(1, args.seeds + 1)] for fw in FRAMEWORKS},
                  {fw: runs / f"{fw}-exact" for fw in FRAMEWORKS} if dtype != "float64" else None)
    _write_json(out / "drift.json", args, dtype, env, {p.name: (p.backend, trained[p.name]) for p in plan})
    _plot(out / "drift.png", env, f"{args.config}, {dtype}")
    _print_table(sys.stdout, args, dtype, env, out)
    return 0 if env.inside else 1


def _initial(config: Config) -> dict[str, np.ndarray]:
    from conformance.data.pipeline import DataPipeline
    from conformance.rules.models import init_params
    from conformance.run.pretrained import initial_weights

    info = DataPipeline(config, 0, 1).info
    given = initial_weights(config, info)
    return given if given is not None else init_params(config.model, info, config.run.seed)


def _init(out: Path, name: str) -> str:
    """The override that starts a run from OUT/init/NAME.safetensors."""
    return f"model.init={json.dumps(str((out / 'init' / f'{name}.safetensors').resolve()))}"


def _plan(configs: dict[str, Config], sides: dict[str, list[str]], seeds: int, out: Path) -> list[Planned]:
    """The twins and the self-runs; writes their initial weights under OUT/init."""
    dt = master_dtype(configs["torch"])
    start = {fw: {k: np.asarray(v, dt) for k, v in _initial(c).items()} for fw, c in configs.items()}
    shapes = {fw: {k: v.shape for k, v in w.items()} for fw, w in start.items()}
    if shapes["torch"] != shapes["jax"]:
        raise ConfigError("the torch and JAX sides build different models (their parameters' names or shapes "
                          "differ); a side's overrides may change the optimizer or the numerics, not the model")
    (out / "init").mkdir(parents=True, exist_ok=True)
    save_tensors(out / "init" / "start.safetensors", {k: v.astype(np.float64) for k, v in start["torch"].items()})  # float64 holds them exactly
    plan = [Planned(fw, fw, [*sides[fw], _init(out, "start")]) for fw in FRAMEWORKS]
    for k in range(1, seeds + 1):
        save_tensors(out / "init" / f"seed{k}.safetensors",
                     {n: v.astype(np.float64) for n, v in nudge_weights(start["torch"], k, dt).items()})
        plan += [Planned(f"{fw}-seed{k}", fw, [*sides[fw], _init(out, f"seed{k}"),
                                               f"optimizer.lr={nudge_lr(configs[fw].optimizer.lr, k, dt)!r}"])
                 for fw in FRAMEWORKS]
    return plan


def _finite(xs: list[float]) -> list[float | None]:
    return [x if math.isfinite(x) else None for x in xs]


def _write_json(path: Path, args: argparse.Namespace, dtype: str, env: Envelope,
                plan: dict[str, tuple[str, list[str]]]) -> None:
    doc = {"config": args.config, "dtype": dtype, "updates": args.updates, "seeds": args.seeds,
           "multiple": MULTIPLE, "inside": env.inside, "worst_ratio": max(env.ratio),
           "worst_update": env.updates[env.worst], "spread": env.spread, "accuracy": env.accuracy,
           "saved_updates": env.updates, "twins": env.twins, "floor": env.floor, "ratio": _finite(env.ratio),
           "selves": env.selves, "exact": env.exact, "rounding": env.rounding, "loss_twins": _finite(env.loss_twins), "loss_floor": _finite(env.loss_floor),
           "runs": {name: {"backend": fw, "set": sets} for name, (fw, sets) in plan.items()}}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _print_table(stream: Any, args: argparse.Namespace, dtype: str, env: Envelope, out: Path) -> None:
    n = len(env.updates)
    rows = sorted(set(range(0, n, max(1, n // 10))) | {n - 1, env.worst})
    selves = np.array(list(env.selves.values())).max(axis=0)
    print(f"drift of {args.config} in {dtype}: {args.updates} updates, {args.seeds} seed(s); the weights' relative "
          f"distance: torch against JAX (twins), the largest of {2 * args.seeds} self-runs from their twin (self), "
          f"the twins' rounding errors combined (rounding); floor = the larger", file=stream)
    print(f"{'update':>8} {'twins':>10} {'self':>10} {'rounding':>10} {'ratio':>7}", file=stream)
    for i in rows:
        print(f"{env.updates[i]:>8} {env.twins[i]:>10.3g} {selves[i]:>10.3g} {env.rounding[i]:>10.3g} "
              f"{env.ratio[i]:>7.3g}", file=stream)
    verdict = "inside the envelope" if env.inside else "OUTSIDE the envelope"
    print(f"largest ratio {max(env.ratio):.3g} after update {env.updates[env.worst]} (limit {MULTIPLE:g}): {verdict}; "
          f"the self-runs' own spread {env.spread:.3g}", file=stream)
    if env.exact:
        last = {fw: e[-1] for fw, e in env.exact.items()}
        print(f"rounding error after update {env.updates[-1]}: torch {last['torch']:.3g}, JAX {last['jax']:.3g} from "
              f"their float64 runs; the larger over the smaller, at most {env.accuracy:.3g}", file=stream)
    lt, lf = np.nanmax(env.loss_twins), np.nanmax(env.loss_floor)
    print(f"loss, per update: the twins differ by at most {lt:.3g} relative, the self-runs by {lf:.3g}", file=stream)
    print(f"wrote {out / 'drift.json'}, {out / 'drift.png'} and the runs in {out / 'runs'}", file=stream)


def _plot(path: Path, env: Envelope, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only, never a window
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7))
    selves = np.array(list(env.selves.values()))
    top.fill_between(env.updates, selves.min(axis=0), selves.max(axis=0), color="0.8", label="self-runs (floor band)")
    if env.exact:
        top.plot(env.updates, env.rounding, "C0:", lw=1, label="rounding errors combined")
    top.plot(env.updates, MULTIPLE * np.array(env.floor), "k--", lw=0.8, label=f"{MULTIPLE:g} x floor")
    top.plot(env.updates, env.twins, "C3o-", ms=3, label="twins: torch vs JAX")
    top.set(yscale="log", ylabel="weights' relative distance", title=title)
    top.legend(fontsize=8)
    t = np.arange(len(env.loss_twins))
    bottom.plot(t, np.array(env.loss_floor, dtype=float), color="0.5", lw=0.7, label="largest self-run")
    bottom.plot(t, np.array(env.loss_twins, dtype=float), "C3", lw=0.7, label="twins")
    bottom.set(yscale="log", xlabel="update", ylabel="loss, relative difference")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
