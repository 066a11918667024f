"""The framework-neutral half of a training run: both trainers are plain loops over these parts.

    run = open_run(config, out_dir, backend="torch", resume=True)   # dir, data, checkpoint, metrics
    for t in range(run.start, run.planned):
        window = run.data.window(t)
        ... framework: forward/backward over the window, unscale, clip, step or skip ...
        run.counters = advance(run.counters, skipped, schedule_advanced)
        run.metrics.log_update(update_record(run, t, window, info, lrs, data_s, compute_s))
        if eval_due(run, t): run.metrics.log_eval(eval_record(t, evaluation))
        if checkpoint_due(run, t): save(run, t + 1, model, optimizer, rng, rng_meta, extra_meta)

Counting (docs/contract.md §2): `t` is the update; the schedule's position is
`counters.schedule_t` (conformance.run.counters). A checkpoint holds the state *after* `update`
updates; resuming continues at t = update (resume policy: conformance.run.resume).

The parts, one concept a file: `session` (this: the output directory, data, checkpoint to resume,
metrics log), `counters`, `resume`, `records` (metrics lines, evaluation totals, when to evaluate
and save, the checkpoint's JSON half), `batches` (window counts, injected overflows),
`throughput` (tokens/s, MFU), `metrics` (metrics.jsonl, progress, TensorBoard), `compare`
(`twinstep compare`). Per-rank RNG layout: conformance.checkpoint.rng.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from conformance import checkpoint as ckpt
from conformance.config import Config, dump_config
from conformance.data import DataPipeline, Dataset
from conformance.errors import CheckpointError, ConfigError
from conformance.rules.inputs import INDEX_LOSSES
from conformance.run.counters import Counters
from conformance.events import Events
from conformance.run.metrics import MetricsLog
from conformance.run.resume import check_resumable, restore_counters


class TrainResult(NamedTuple):
    """What `train(...)` returns on both backends: the final parameters as float64-or-native NumPy
    arrays by neutral name, the loss of every update run in this process, and where things went."""

    params: dict[str, Any]
    losses: list[float]
    updates_done: int
    out_dir: Path
    checkpoint: Path | None


@dataclass
class Run:
    """Everything a trainer needs besides its framework objects."""

    config: Config
    out_dir: Path
    backend: str
    data: DataPipeline
    metrics: MetricsLog | None
    checkpoint: ckpt.Checkpoint | None
    counters: Counters
    rank: int = 0
    world_size: int = 1
    events: Events | None = None

    @property
    def start(self) -> int:
        return self.counters.updates_done

    @property
    def planned(self) -> int:
        return self.data.planned_updates

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file so that a reader sees the old or the new content, never a mix."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_run(config: Config, out_dir: str | Path, backend: str, resume: bool = False, rank: int = 0,
             world_size: int = 1, progress: str = "auto", metrics: bool = True, events: Events | None = None,
             dataset: Dataset | None = None, check_loss: bool = True) -> Run:
    """Prepare the output directory, the data, the checkpoint to resume from and the metrics log.

    Rank 0 writes DIR/config.toml and owns metrics and checkpoints; other ranks get metrics=None.
    `dataset`: data passed to train() (conformance.run.objects), else the config's; `check_loss`:
    refuse a `[loss]` that does not fit the targets (False when a loss_fn replaces `[loss]`)."""
    out = Path(out_dir)
    data = DataPipeline(config, rank, world_size, dataset)
    if check_loss:
        check_task(config, data.info.task)
    checkpoint = None
    counters = Counters()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        ckpt.prepare_directory(out / "checkpoints")
    if resume:
        path = ckpt.find_latest(out / "checkpoints", allow_fallback=config.checkpoint.allow_fallback)
        if path is not None:
            checkpoint = ckpt.load_checkpoint(path)
            check_resumable(checkpoint.state.config, config, path)
            meta = checkpoint.state.meta or {}
            data.check_position(meta.get("data", {}))
            counters = restore_counters(meta, checkpoint.state.update)
            if counters.updates_done > data.planned_updates:
                raise CheckpointError(
                    f"{path} holds {counters.updates_done} updates, but this config plans "
                    f"{data.planned_updates} (run.epochs / run.max_updates); a run cannot be shortened")
    elif rank == 0 and ckpt.list_checkpoints(out / "checkpoints"):
        raise CheckpointError(
            f"{out / 'checkpoints'} already holds checkpoints; pass --resume to continue that run, "
            f"or choose another --out directory (nothing was overwritten)"
        )
    log = None
    if rank == 0:
        write_text_atomic(out / "config.toml", dump_config(config))
        if metrics:
            log = MetricsLog(out, data.planned_updates, resume_from=counters.updates_done if resume else None,
                             progress=progress, tensorboard=bool(getattr(config.run, "tensorboard", False)),
                             log_every=config.run.log_every)
    return Run(config, out, backend, data, log, checkpoint, counters, rank, world_size, events)


TASK_LOSSES: dict[str, tuple[str, ...]] = {
    "classification": INDEX_LOSSES,
    "language_model": INDEX_LOSSES,
    "regression": ("mse", "l1", "huber", "smooth_l1"),
}


def check_task(config: Config, task: str) -> None:
    """Refuse a loss that cannot train on the data's targets (class indices vs. real values)."""
    allowed = TASK_LOSSES.get(task, ())
    if config.loss.name not in allowed:
        raise ConfigError(f"loss.name = {config.loss.name!r} does not fit data set {config.data.name!r} "
                          f"({task} targets); use one of {', '.join(allowed)}")
