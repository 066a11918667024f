"""The run's decisions, written once for both trainers: opening the run directory with every rank
agreeing, the best validation loss, and the checkpoint after an update (due, or asked for by
SIGTERM / SIGINT on any rank, which then stops the run).

    run = open_on_every_rank(agree, config, out_dir, "torch", resume=True, rank=r, world_size=w)
    for t in range(run.start, run.planned):
        ... the framework's update t, its metrics line ...
        if eval_due(run, t): record_evaluation(run, eval_record(t, totals))
        checkpoint_or_stop(run, t, lambda done: save(done, ...))   # raises Preempted to stop

`agree(ok) -> bool` is the one collective a trainer supplies for these decisions: True when every
rank's `ok` is True (a MIN all-reduce; one process: `ok` itself), the same answer on every rank.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.errors import ConfigError, TwinstepError
from conformance.run.records import checkpoint_due
from conformance.run.session import Agree, Run, open_run

__all__ = ["checkpoint_or_stop", "open_on_every_rank", "record_evaluation", "resolve_world"]


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
