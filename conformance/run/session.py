"""The framework-neutral half of a training run: both trainers are plain loops over these parts.

    run = open_run(config, out_dir, backend="torch", resume=True)   # dir, data, checkpoint, metrics
    for t in range(run.start, run.planned):
        window = run.data.window(t)
        ... framework: forward/backward over the window, unscale, clip, step or skip ...
        run.counters = advance(run.counters, skipped, schedule_advanced)
        run.metrics.log_update(update_record(run, t, window, info, lrs, data_s, compute_s))
        if eval_due(run, t): record_evaluation(run, eval_record(t, evaluation))
        checkpoint_or_stop(run, t, save)          # due, or SIGTERM / SIGINT: save (and stop)

Counting (docs/contract.md §2): `t` is the update; the schedule's position is
`counters.schedule_t` (conformance.run.counters). A checkpoint holds the state *after* `update`
updates; resuming continues at t = update (resume policy: conformance.run.resume).

The parts, one concept a file: `session` (this: the output directory, data, checkpoint to resume,
metrics log), `rundir` (the lock, ownership and clean-up of the output directory), `preflight`
(cross-field checks before training), `loop` (the run's decisions: opening with every rank
agreeing, the best validation loss, the checkpoint or stop after an update), `validate` (every
field of a checkpoint before a resume),
`preempt` (SIGTERM / SIGINT: save and stop), `counters`, `resume`, `records` (metrics lines,
evaluation totals, when to evaluate and save, the checkpoint's JSON half), `batches` (window counts,
injected overflows), `throughput` (tokens/s, MFU), `metrics` (metrics.jsonl, progress,
TensorBoard), `compare` (`twinstep compare`). Per-rank RNG layout: conformance.checkpoint.rng.

A run ends with `run.close()` (metrics closed, the directory's lock released, signal handlers
restored), also when it fails. Preemption: conformance.run.loop.checkpoint_or_stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from conformance import checkpoint as ckpt
from conformance.config import Config, dump_config
from conformance.data import DataPipeline, Dataset
from conformance.errors import CheckpointError, ConfigError, Preempted
from conformance.events import Events
from conformance.files import write_text_atomic
from conformance.rules.inputs import INDEX_LOSSES
from conformance.run.counters import Counters
from conformance.run.metrics import MetricsLog
from conformance.run.preempt import Preemption
from conformance.run.preflight import check_data_size, check_run
from conformance.run.resume import check_resumable, pick_checkpoint, restore_counters
from conformance.run.rundir import RunDir, claim
from conformance.run.validate import check_data_position


# agree(ok) -> True when every rank's ok is True, the same answer on every rank (one process: ok)
Agree = Callable[[bool], bool]


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
    owner: RunDir | None = None
    preemption: Preemption = field(default_factory=Preemption)
    agree: Agree | None = None
    last_checkpoint: Path | None = None

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

    def stop_requested(self) -> bool:
        """Whether SIGTERM / SIGINT asked this run to stop after the current update: here, or with
        several ranks and `agree`, on any rank (every rank answers alike; collective)."""
        agree = self.agree
        if agree is None or self.world_size == 1:
            return self.preemption.requested()
        return self.preemption.requested(lambda asked: not agree(not asked))

    def preempted(self, updates_done: int, checkpoint: Path | None) -> Preempted:
        """The error that ends a preempted run after `updates_done` updates (saved to `checkpoint`;
        on ranks other than 0, where rank 0 saved it)."""
        path = checkpoint if checkpoint is not None else self.checkpoint_dir / ckpt.step_name(updates_done)
        return self.preemption.stopped(updates_done, self.planned, path)

    def close(self) -> None:
        """End the run: metrics closed, signal handlers restored, the directory's lock released."""
        try:
            if self.metrics is not None:
                self.metrics.close()
        finally:
            self.preemption.uninstall()
            if self.owner is not None:
                self.owner.release()


def open_run(config: Config, out_dir: str | Path, backend: str, resume: bool = False, rank: int = 0,
             world_size: int = 1, progress: str = "auto", metrics: bool = True, events: Events | None = None,
             dataset: Dataset | None = None, check_loss: bool = True, agree: Agree | None = None) -> Run:
    """Prepare the output directory, the data, the checkpoint to resume from and the metrics log.

    Rank 0 claims the directory (conformance.run.rundir: lock, ownership, clean-up), writes
    DIR/config.toml and owns metrics and checkpoints; other ranks get metrics=None. Every rank
    records SIGTERM / SIGINT from here until `Run.close()` (conformance.run.preempt).
    `dataset`: data passed to train() (conformance.run.objects), else the config's; `check_loss`:
    refuse a `[loss]` that does not fit the targets (False when a loss_fn replaces `[loss]`);
    `agree`: the ranks' agreement for Run.stop_requested (conformance.run.loop.open_on_every_rank
    opens every rank of a run with it)."""
    out = Path(out_dir)
    if dataset is None:
        check_data_size(config)
    data = DataPipeline(config, rank, world_size, dataset)
    if check_loss:
        check_task(config, data.info.task)
    check_run(config, data, world_size)
    owner = claim(out, resume) if rank == 0 else None
    try:
        run = _open(config, out, backend, resume, rank, world_size, data, progress, metrics, events, owner)
    except BaseException:
        if owner is not None:
            owner.release()
        raise
    run.agree = agree
    run.preemption.install()
    return run


def _open(config: Config, out: Path, backend: str, resume: bool, rank: int, world_size: int, data: DataPipeline,
          progress: str, metrics: bool, events: Events | None, owner: RunDir | None) -> Run:
    checkpoint = None
    counters = Counters()
    if rank == 0:
        ckpt.prepare_directory(out / "checkpoints")
    if resume:
        # lazy: a sharded checkpoint's ranks each read only their slices (the trainers' restore)
        checkpoint = pick_checkpoint(out / "checkpoints", config.checkpoint.allow_fallback, True)
        if checkpoint is not None:
            path = checkpoint.path
            check_resumable(checkpoint.state.config, config, path, checkpoint.manifest["world_size"], world_size)
            meta = checkpoint.state.meta or {}
            data.check_position(meta["data"])
            check_data_position(meta["data"], data.position(checkpoint.state.update), path)
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
            trackers = list(dict.fromkeys((["tensorboard"] if config.run.tensorboard else []) + config.run.loggers))
            log = MetricsLog(out, data.planned_updates, resume_from=counters.updates_done if resume else None,
                             progress=progress, loggers=trackers, log_every=config.run.log_every,
                             config=config.model_dump(mode="json"))
            if resume:  # never silent: where it continues, or that there was nothing to continue
                log.note(f"resumed from {checkpoint.path} (update {counters.updates_done})" if checkpoint else
                         f"--resume: no checkpoint in {out / 'checkpoints'}; starting at update 0")
    return Run(config, out, backend, data, log, checkpoint, counters, rank, world_size, events, owner)


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
