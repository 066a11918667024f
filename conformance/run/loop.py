"""The run written once: the driver that owns a training run's decisions for both trainers. A
trainer supplies only its framework steps (Steps); `drive` runs the updates in one fixed order:

    run = open_on_every_rank(agree, config, out_dir, "torch", resume=True, rank=r, world_size=w)
    for t in range(run.start, run.planned):
        done = steps.update(t)                    # the framework's update t over run.data.window(t)
        counters advance; metrics line (with tokens/s and MFU)
        if eval_due(run, t): steps.evaluate(t) → eval line, best validation loss, steps.observe
        checkpoint_or_stop(run, t, ...)           # due, or SIGTERM / SIGINT on any rank: save (and stop)
    TrainResult(steps.final_params(), losses, ...)

`agree(ok) -> bool` is the one collective a trainer supplies for these decisions: True when every
rank's `ok` is True (a MIN all-reduce; one process: `ok` itself), the same answer on every rank.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from conformance.errors import ConfigError, TwinstepError
from conformance.data import Window
from conformance.run.counters import advance
from conformance.run.records import EvalTotals, checkpoint_due, eval_due, eval_record, update_record
from conformance.run.session import Agree, Run, TrainResult, open_run
from conformance.run.throughput import throughput_extras

__all__ = ["Steps", "Update", "checkpoint_or_stop", "drive", "open_on_every_rank", "record_evaluation",
           "resolve_world"]


class Update(NamedTuple):
    """What one framework update tells the driver."""

    window: Window  # the update's micro-batches (conformance.data)
    info: Mapping[str, Any]  # loss, grad_norm, skipped, loss_scale, schedule_advanced
    lrs: list[float]  # every group's lr the update applied
    data_s: float  # seconds laying out the window on the host
    compute_s: float  # seconds of the update itself


class Steps(Protocol):
    """A trainer's framework steps: all the driver asks of it."""

    device_name: str | None  # the accelerator's kind for MFU (None: the CPU)

    def update(self, t: int) -> Update:
        """Run update t over run.data.window(t) (raising NonFiniteError under the policy)."""

    def evaluate(self, t: int) -> EvalTotals:
        """Validation sums after update t over every rank, with the weights evaluations see."""

    def observe(self, record: Mapping[str, Any]) -> None:
        """An evaluation's record, for a schedule that watches it (reduce_on_plateau)."""

    def save(self, updates_done: int, val_loss: float | None) -> Path | None:
        """Checkpoint the state after `updates_done` updates; collective (rank 0's path, else None)."""

    def peak_memory_bytes(self) -> int:
        """The accelerator's peak bytes in use so far (the CPU: the process's peak RSS)."""

    def final_params(self) -> dict[str, Any]:
        """The training weights as NumPy arrays by neutral name, once the last update is done."""


def drive(run: Run, steps: Steps) -> TrainResult:
    """Run updates run.start .. run.planned - 1 (see the module docstring); the run's decisions are
    made here, in this order after every update: counters, metrics line, evaluation (best
    validation loss, observed by the schedule), checkpoint or stop. The caller closes the run."""
    losses: list[float] = []
    for t in range(run.start, run.planned):
        done = steps.update(t)
        info = done.info
        run.counters = advance(run.counters, info["skipped"], info["schedule_advanced"])
        losses.append(info["loss"])
        if run.metrics is not None:
            extra = {"peak_memory_bytes": steps.peak_memory_bytes(),
                     **throughput_extras(run.config, run, done.window, done.data_s + done.compute_s,
                                         steps.device_name)}
            run.metrics.log_update(update_record(run, t, done.window, info, done.lrs, done.data_s,
                                                 done.compute_s, **extra))
        val_loss = None
        if eval_due(run, t):
            record = eval_record(t, steps.evaluate(t), run.data.info.task == "language_model")
            subset = run.data.eval_subset()
            if subset is not None:  # run.eval_batches: the estimate's size goes with it
                record["val_batches"] = len(subset)
            record_evaluation(run, record)
            steps.observe(record)  # updates t + 1, ... apply what it decides
            val_loss = record["val_loss"]
        checkpoint_or_stop(run, t, lambda done_: steps.save(done_, val_loss))
    return TrainResult(steps.final_params(), losses, run.counters.updates_done, run.out_dir,
                       run.last_checkpoint)


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int, int]:
    """(rank, world_size, local_rank): explicit values win, else the launcher's RANK / WORLD_SIZE /
    LOCAL_RANK (torchrun), else a single process. ConfigError for a rank outside the world."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1")) if world_size is None else int(world_size)
    r = int(env.get("RANK", "0")) if rank is None else int(rank)
    local = int(env.get("LOCAL_RANK", str(r)))
    if world < 1 or not 0 <= r < world:
        raise ConfigError(f"rank {r} is not in 0..{world - 1} (world_size {world})")
    return r, world, local


def open_on_every_rank(agree: Agree, config: Any, out_dir: str | Path, backend: str, *, rank: int = 0,
                       world_size: int = 1, **kwargs: Any) -> Run:
    """`session.open_run` on every rank, ranks agreeing: rank 0 prepares the directory (and may
    refuse it) before the other ranks read from it; when a rank fails, every rank raises (the
    failing rank its own error, the others a TwinstepError naming who failed) after closing what it
    had opened, so no lock or signal handler outlives a refused start. The Run keeps `agree` for
    the stop decisions (Run.stop_requested)."""
    def attempt() -> Run | TwinstepError:
        try:
            return open_run(config, out_dir, backend, rank=rank, world_size=world_size, agree=agree, **kwargs)
        except TwinstepError as exc:
            return exc

    run = attempt() if rank == 0 else None
    for who in ("rank 0", "another rank"):
        if who == "another rank" and rank != 0:
            run = attempt()
        if not agree(not isinstance(run, TwinstepError)):
            if isinstance(run, Run):
                run.close()
            raise run if isinstance(run, TwinstepError) else TwinstepError(f"{who} could not open the run; see its error")
    return run  # type: ignore[return-value]


def record_evaluation(run: Run, record: dict[str, Any]) -> None:
    """After an evaluation: its line in metrics.jsonl, and `record["val_loss"]` as the run's best
    validation loss when finite and lower (checkpointed with the counters)."""
    val = record["val_loss"]
    best = run.counters.best_val_loss
    if math.isfinite(val) and (best is None or val < best):
        run.counters = run.counters._replace(best_val_loss=float(val))
    if run.metrics is not None:
        run.metrics.log_eval(record)


def checkpoint_or_stop(run: Run, t: int, save: Callable[[int], Path | None]) -> None:
    """After update t: `save(t + 1)` when a checkpoint is due (records.checkpoint_due) or SIGTERM /
    SIGINT asked any rank to stop before the last update; then, if asked, stop by raising Preempted
    (`run.last_checkpoint` is what was written). Collective: every rank calls it at every update."""
    stop = t + 1 < run.planned and run.stop_requested()
    if stop or checkpoint_due(run, t):
        run.last_checkpoint = save(t + 1)
    if stop:
        raise run.preempted(t + 1, run.last_checkpoint)
