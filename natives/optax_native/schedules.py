"""optax's schedules for a [schedule] spec, one per parameter group (each from its own lr, as with
optax.multi_transform), evaluated at optax's int32 update count:

constant → constant_schedule (piecewise_constant_schedule with a factor); step →
exponential_decay(staircase=True); multistep → piecewise_constant_schedule; exponential →
exponential_decay; cosine → cosine_decay_schedule(alpha = eta_min / lr); linear → linear_schedule;
polynomial → polynomial_schedule; onecycle → cosine_onecycle_schedule (linear three-phase:
linear_onecycle_schedule), which cycle no momentum; cosine_restarts → sgdr_schedule with enough
cycles for the run; warmup_cosine → warmup_cosine_decay_schedule; sequential → join_schedules.
optax has no inverse_sqrt or wsd schedule; `unit = "epoch"` evaluates at count // updates_per_epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from conformance.config import OptimizerSpec, ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import check_schedule
from natives._protocol import refuse, require

Schedule = Callable[[Any], Any]


def schedule_fn(spec: ScheduleSpec, base: float, horizon: int, updates_per_epoch: int = 1) -> Schedule:
    """The optax schedule of one group with base lr `base`, for a run of `horizon` updates."""
    f = _make(spec, base, horizon)
    return f if spec.unit != "epoch" else (lambda count: f(count // updates_per_epoch))


def _make(spec: ScheduleSpec, base: float, horizon: int) -> Schedule:
    n = spec.name
    if n == "constant":
        if spec.factor is None:
            return optax.constant_schedule(base)
        return optax.piecewise_constant_schedule(base * spec.factor, {spec.total_iters: 1 / spec.factor})
    if n == "step":
        return optax.exponential_decay(base, spec.step_size, spec.gamma, staircase=True)
    if n == "multistep":
        return optax.piecewise_constant_schedule(base, {m: spec.gamma for m in spec.milestones})
    if n == "exponential":
        return optax.exponential_decay(base, 1, spec.gamma)
    if n == "cosine":
        return optax.cosine_decay_schedule(base, spec.t_max, alpha=spec.eta_min / base)
    if n == "linear":
        return optax.linear_schedule(base * spec.start_factor, base * spec.end_factor, spec.total_iters)
    if n == "polynomial":
        return optax.polynomial_schedule(base, 0.0, spec.power, spec.total_iters)
    if n == "onecycle":
        return _onecycle(spec, base)
    if n == "cosine_restarts":
        lengths, t = [], spec.t_0
        while sum(lengths) < horizon:
            lengths.append(t)
            t *= spec.t_mult
        return optax.sgdr_schedule([dict(init_value=base, peak_value=base, warmup_steps=0, decay_steps=n_,
                                         end_value=spec.eta_min) for n_ in lengths])
    if n == "warmup_cosine":
        require(spec, "schedule", "convention", ("optax",), "optax.warmup_cosine_decay_schedule")
        return optax.warmup_cosine_decay_schedule(base * spec.start_factor, base, spec.warmup_steps,
                                                  spec.total_steps, spec.eta_min)
    if n == "sequential":
        return optax.join_schedules([_make(p, base, horizon) for p in spec.schedulers], spec.milestones)
    raise refuse(f"schedule.name = {n!r}", "optax has no such schedule")


def _onecycle(spec: ScheduleSpec, base: float) -> Schedule:
    peak = spec.max_lr if spec.max_lr is not None else base
    if spec.anneal_strategy == "cos" and not spec.three_phase:
        return optax.cosine_onecycle_schedule(spec.total_steps, peak, spec.pct_start, spec.div_factor,
                                              spec.final_div_factor)
    if spec.anneal_strategy == "linear" and spec.three_phase:
        return optax.linear_onecycle_schedule(spec.total_steps, peak, spec.pct_start, 2 * spec.pct_start,
                                              spec.div_factor, spec.final_div_factor)
    raise refuse(f"onecycle with anneal_strategy = {spec.anneal_strategy!r}, three_phase = {spec.three_phase}",
                 "optax's onecycle schedules are cosine two-phase or linear three-phase")


def schedule_values(schedule: ScheduleSpec, optimizer: OptimizerSpec, steps: int,
                    updates_per_epoch: int = 1) -> dict[str, Any]:
    """Every group's lr at optax counts 0..steps-1 (int32, as optax's state holds them); no momentum."""
    check_schedule(schedule, optimizer, steps, updates_per_epoch)
    fns = [schedule_fn(schedule, lr, steps, updates_per_epoch) for lr in group_base_lrs(optimizer)]
    lr = [[float(f(jnp.asarray(t, jnp.int32))) for f in fns] for t in range(steps)]
    return {"lr": np.array(lr), "momentum": None}
