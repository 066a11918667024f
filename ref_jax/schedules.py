"""Learning-rate schedules: the framework's own schedule objects, one value per update.

torch: torch.optim.lr_scheduler classes (ref_torch._schedules.build_scheduler), stepped after
every optimizer.step(); JAX: one jittable optax schedule per param group, of the update count
(ref_jax._schedules.build_schedules; onecycle with cycle_momentum also yields momentum or beta1
schedules). Either way update t applies the value at t (docs/contract.md §2).
`schedule_values` is the neutral entry point the conformance harness calls: torch drives the
scheduler on a stand-in optimizer (SGD, or Adam when onecycle cycles beta1) and reads the lr
(and cycled momentum) each update applies; JAX evaluates the schedules at every update count.
Closed forms: conformance/oracle/schedules.py.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from conformance.config.schedule import ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import check_schedule, cycled_hyperparameter
from ref_jax._schedules import build_schedules

_CHUNK = 512  # updates evaluated per call

__all__ = ["schedule_values"]


def schedule_values(
    schedule: ScheduleSpec, optimizer: Any, steps: int, updates_per_epoch: int = 1
) -> dict[str, Any]:
    """The values updates t = 0..steps-1 apply: {"lr": (steps, groups) float64 array, "momentum":
    (steps, groups) array of the cycled momentum or beta1, or None, "momentum_name": "momentum" |
    "beta1" | None}. `optimizer` is the OptimizerSpec: it gives each group's base lr, in the order
    of conformance.rules.groups.group_base_lrs, and which hyperparameter onecycle cycles."""
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
