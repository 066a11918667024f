"""keras.optimizers.schedules for a [schedule] spec, evaluated at Keras's iteration count (update t
applies schedule(t)); Keras has one learning rate per optimizer, so one schedule from the base lr of
each group.

constant → the float lr (PiecewiseConstantDecay with a factor); step → ExponentialDecay(staircase);
multistep → PiecewiseConstantDecay (a Keras boundary b keeps its value up to step b: torch's
milestone m is boundary m − 1); exponential → ExponentialDecay; cosine → CosineDecay(alpha =
eta_min / lr), which holds the floor past decay_steps; linear and polynomial → PolynomialDecay;
cosine_restarts → CosineDecayRestarts (with m_mul); warmup_cosine → CosineDecay with
warmup_target; polynomial's end_factor → PolynomialDecay's end_learning_rate; tabulated →
PiecewiseConstantDecay with a boundary at every step of the table. Keras has no onecycle,
inverse_sqrt, wsd, sequential, chained or cyclic schedule, no end value for ExponentialDecay, no
per-epoch schedules, and ReduceLROnPlateau is a callback of Model.fit, not a schedule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.config import OptimizerSpec, ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import check_metrics, check_schedule, spots
from natives._protocol import refuse, require
from natives.keras_backend.backend import load


def schedule(spec: ScheduleSpec, base: float) -> Any:
    """The Keras learning rate of the spec from base lr `base` (a float or a LearningRateSchedule)."""
    S = load().optimizers.schedules
    require(spec, "schedule", "unit", ("update",), "keras.optimizers.schedules (they count iterations)")
    n = spec.name
    if n in ("step", "exponential"):
        require(spec, "schedule", "end_factor", (None,), "keras ExponentialDecay (no end value)")
    if n == "reduce_on_plateau":
        raise refuse("schedule.name = 'reduce_on_plateau'", "keras.callbacks.ReduceLROnPlateau drives Model.fit; "
                                                            "keras.optimizers.schedules has no such schedule")
    if n == "constant":
        if spec.factor is None:
            return base
        return S.PiecewiseConstantDecay([spec.total_iters - 1], [base * spec.factor, base])
    if n == "step":
        return S.ExponentialDecay(base, spec.step_size, spec.gamma, staircase=True)
    if n == "multistep":
        return S.PiecewiseConstantDecay([m - 1 for m in spec.milestones],
                                        [base * spec.gamma**k for k in range(len(spec.milestones) + 1)])
    if n == "exponential":
        return S.ExponentialDecay(base, 1, spec.gamma)
    if n == "cosine":
        return S.CosineDecay(base, spec.t_max, alpha=spec.eta_min / base)
    if n == "linear":
        return S.PolynomialDecay(base * spec.start_factor, spec.total_iters, base * spec.end_factor, power=1.0)
    if n == "polynomial":
        return S.PolynomialDecay(base, spec.total_iters, base * spec.end_factor, power=spec.power)
    if n == "cosine_restarts":
        return S.CosineDecayRestarts(base, spec.t_0, t_mul=float(spec.t_mult), m_mul=spec.m_mul, alpha=spec.eta_min / base)
    if n == "warmup_cosine":
        require(spec, "schedule", "convention", ("optax",), "keras CosineDecay (it holds the floor)")
        return S.CosineDecay(base * spec.start_factor, spec.total_steps - spec.warmup_steps,
                             alpha=spec.eta_min / base, warmup_target=base, warmup_steps=spec.warmup_steps)
    if n == "tabulated":  # boundary k keeps factors[k] up to step k (inclusive); the last held past them
        values = [base * f for f in spec.factors]
        return values[0] if len(values) == 1 else S.PiecewiseConstantDecay(list(range(len(values) - 1)), values)
    raise refuse(f"schedule.name = {n!r}", "keras.optimizers.schedules has no such schedule")


def values(lr: Any, rows: Any) -> list[float]:
    """The learning rate Keras applies at the iterations `rows` (the schedule jitted once, as Keras's
    training step runs it)."""
    import jax
    import jax.numpy as jnp

    if not callable(lr):
        return [float(lr)] * len(rows)
    f = jax.jit(lr)
    return [float(f(jnp.asarray(t, "int32"))) for t in rows]


def schedule_values(schedule_spec: ScheduleSpec, optimizer: OptimizerSpec, steps: int, updates_per_epoch: int = 1, *,
                    at: list[int] | None = None, metrics: list[float] | None = None) -> dict[str, Any]:
    """Every group's lr at iterations 0..steps-1 (or the `at` iterations); Keras cycles no momentum."""
    check_schedule(schedule_spec, optimizer, steps, updates_per_epoch)
    check_metrics(schedule_spec, metrics, steps)
    rows = spots(steps, at)
    cols = [values(schedule(schedule_spec, base), rows) for base in group_base_lrs(optimizer)]
    return {"lr": np.array(cols).T, "momentum": None}
