"""Learning-rate schedules in JAX: optax schedules of the optimizer's update count.

The trainer gets one jittable schedule per param group from `build_schedules(spec, base_lrs,
updates_per_epoch)` (see ref_jax._schedules) and feeds it the update count: update t applies the
value at t (docs/contract.md §2), as optax's scale_by_schedule / inject_hyperparams do. onecycle with
cycle_momentum also yields momentum (or beta1) schedules. `schedule_values` is the neutral entry
point the conformance harness calls. Closed forms: conformance/oracle/schedules.py.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from conformance.config.schedule import ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import check_schedule, cycled_hyperparameter
from ref_jax._schedules import (
    GroupSchedules,
    build_schedules,
    lr_schedule,
    schedule_step,
)

_CHUNK = 512  # updates evaluated per call

__all__ = ["GroupSchedules", "build_schedules", "lr_schedule", "schedule_step", "schedule_values"]


def schedule_values(
    schedule: ScheduleSpec, optimizer: Any, steps: int, updates_per_epoch: int = 1
) -> dict[str, Any]:
    """The values updates t = 0..steps-1 apply: {"lr": (steps, groups) float64 array, "momentum":
    (steps, groups) array of the cycled momentum or beta1, or None, "momentum_name": "momentum" |
    "beta1" | None}. `optimizer` is the OptimizerSpec: it gives each group's base lr, in the order
    of conformance.config.schedule.group_base_lrs, and which hyperparameter onecycle cycles."""
    check_schedule(schedule, optimizer, steps, updates_per_epoch)
    name = cycled_hyperparameter(schedule, optimizer)
    built = build_schedules(schedule, group_base_lrs(optimizer), updates_per_epoch)
    chunks = [jnp.arange(i, i + _CHUNK, dtype=jnp.int32) for i in range(0, steps, _CHUNK)]

    def table(fns: tuple) -> np.ndarray:
        # int32 counts, as optax's; fixed-size chunks let every case reuse the compiled ops
        cols = [np.concatenate([np.broadcast_to(np.asarray(fn(c), np.float64), (_CHUNK,)) for c in chunks])
                for fn in fns]
        return np.stack(cols, axis=1)[:steps]

    momentum = None if built.momentum is None else table(built.momentum)
    return {"lr": table(built.lr), "momentum": momentum, "momentum_name": name}
