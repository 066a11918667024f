"""Learning-rate schedules: the framework's own schedule objects, one value per update.

torch: torch.optim.lr_scheduler classes (ref_torch._schedules.build_scheduler), stepped after
every optimizer.step(); JAX: one jittable optax schedule per param group, of the update count
(ref_jax._schedules.build_scheduler; onecycle and cyclic with cycle_momentum also yield momentum
or beta1 schedules). Either way update t applies the value at t (docs/contract.md §2).
reduce_on_plateau follows observed metrics instead: torch's ReduceLROnPlateau
(ref_torch._schedules.MetricPlateau) or a small pure step over a NamedTuple state
(ref_jax._schedules.plateau_step), fed the metric after each update that observes one.
`schedule_values` is the neutral entry point the conformance harness calls: torch drives the
scheduler on a stand-in optimizer (SGD, or Adam when the schedule cycles beta1) and reads the lr
(and cycled momentum) each update applies; JAX evaluates the schedules at every update count
asked for. Closed forms: conformance/oracle/schedules.py.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from conformance.config.schedule import ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import (
    check_metrics,
    check_schedule,
    cycled_hyperparameter,
    hyper_bases,
    spots,
)
from ref_jax._schedules import PlateauState, build_hyper, build_scheduler, plateau_init, plateau_step

_CHUNK = 512  # updates evaluated per call

__all__ = ["schedule_values"]


def schedule_values(
    schedule: ScheduleSpec, optimizer: Any, steps: int, updates_per_epoch: int = 1, *,
    at: Any = None, metrics: Any = None,
) -> dict[str, Any]:
    """The values updates t = 0..steps-1 apply (or only the updates listed in `at`, strictly
    increasing): {"lr": (rows, groups) float64 array, "momentum": (rows, groups) array of the
    cycled momentum or beta1, or None, "momentum_name": "momentum" | "beta1" | None, "hyper": {key:
    (rows, groups) array, NaN where the group does not read the key} for [schedule.hyper]}. `optimizer`
    is the OptimizerSpec: it gives each group's base lr, in the order of
    conformance.rules.groups.group_base_lrs, and which hyperparameter onecycle / cyclic cycle.
    `metrics` (reduce_on_plateau only): the value observed after each update t = 0..steps-1."""
    check_schedule(schedule, optimizer, steps, updates_per_epoch)
    observed = check_metrics(schedule, metrics, steps)
    rows = spots(steps, at)
    name = cycled_hyperparameter(schedule, optimizer)
    base = group_base_lrs(optimizer)
    hyper = build_hyper(schedule, hyper_bases(schedule, optimizer), updates_per_epoch)
    if schedule.name == "reduce_on_plateau":
        return {"lr": _plateau_table(schedule, base, observed, steps)[rows], "momentum": None, "momentum_name": None,
                "hyper": {key: _table(fns, rows) for key, fns in hyper.items()}}
    built = build_scheduler(schedule, base, updates_per_epoch)
    momentum = None if built.momentum is None else _table(built.momentum, rows)
    return {"lr": _table(built.lr, rows), "momentum": momentum, "momentum_name": name,
            "hyper": {key: _table(fns, rows) for key, fns in hyper.items()}}


def _table(fns: tuple, rows: np.ndarray) -> np.ndarray:
    """Each schedule at the updates `rows`, one column per schedule (NaN for None: not read)."""
    padded = np.concatenate([rows, np.full(-len(rows) % _CHUNK, rows[-1])])
    # int32 counts, as optax's; fixed-size chunks let every case reuse the compiled ops
    chunks = [jnp.asarray(padded[i:i + _CHUNK], dtype=jnp.int32) for i in range(0, len(padded), _CHUNK)]
    cols = [np.full(len(padded), np.nan) if fn is None else
            np.concatenate([np.broadcast_to(np.asarray(fn(c), np.float64), (_CHUNK,)) for c in chunks]) for fn in fns]
    return np.stack(cols, axis=1)[:len(rows)]


def _plateau_table(schedule: ScheduleSpec, base: list[float], metrics: Any, steps: int) -> np.ndarray:
    """Every update's lrs: row t holds the lrs after the metrics of updates 0..t-1 (one lax.scan)."""
    state = plateau_init(schedule, base)
    if metrics is None:
        return np.tile(np.asarray(state.lrs, np.float64), (steps, 1))

    def observe(carry: PlateauState, metric: Any) -> tuple[PlateauState, Any]:
        return plateau_step(schedule, carry, metric), carry.lrs  # the lrs update t applies, then observe

    _, lrs = jax.lax.scan(observe, state, jnp.asarray(metrics))
    return np.asarray(lrs, np.float64)
