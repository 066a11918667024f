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

import numpy as np
import torch

from conformance.config.schedule import ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import (
    check_metrics,
    check_schedule,
    cycled_hyperparameter,
    hyper_bases,
    spots,
)
from ref_torch._schedules import build_scheduler, hyper_values

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
    base = group_base_lrs(optimizer)
    name = cycled_hyperparameter(schedule, optimizer)
    params = [torch.zeros(1, dtype=torch.float64, requires_grad=True) for _ in base]
    groups = [{"params": [p], "lr": b} for p, b in zip(params, base)]
    # stand-in optimizer: OneCycleLR / CyclicLR cycle `betas[0]` when the class has betas, else `momentum`
    opt = torch.optim.Adam(groups) if name == "beta1" else torch.optim.SGD(groups, momentum=0.0)
    scheduler = build_scheduler(schedule, opt, updates_per_epoch)
    last = int(rows[-1])
    lr = np.empty((last + 1, len(base)))
    momentum = None if name is None else np.empty((last + 1, len(base)))
    for t in range(last + 1):
        for g, group in enumerate(opt.param_groups):
            lr[t, g] = float(group["lr"])
            if momentum is not None:
                momentum[t, g] = float(group["betas"][0] if name == "beta1" else group["momentum"])
        if t < last:
            opt.step()  # no gradients: a no-op that keeps torch's step-order bookkeeping honest
            scheduler.step()  # ReduceLROnPlateau: a no-op; it moves on the metric below
            if observed is not None:
                scheduler.step(float(observed[t]))  # the metric observed after update t
    return {"lr": lr[rows], "momentum": None if momentum is None else momentum[rows], "momentum_name": name,
            "hyper": {key: hyper_values(schedule.hyper[key], bases, last + 1, updates_per_epoch)[rows]  # type: ignore[index]
                      for key, bases in hyper_bases(schedule, optimizer).items()}}

