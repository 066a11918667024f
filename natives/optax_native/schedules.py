"""optax's schedules for a [schedule] spec, one per parameter group (each from its own lr, as with
optax.multi_transform), evaluated at optax's int32 update count:

constant → constant_schedule (piecewise_constant_schedule with a factor); step →
exponential_decay(staircase=True); multistep → piecewise_constant_schedule; exponential →
exponential_decay; cosine → cosine_decay_schedule(alpha = eta_min / lr); linear → linear_schedule;
polynomial → polynomial_schedule; `end_factor` → their end_value; onecycle →
cosine_onecycle_schedule (linear three-phase: linear_onecycle_schedule), which cycle no momentum;
cosine_restarts → sgdr_schedule with enough cycles for the run (m_mul: each cycle's peak
η + (lr − η)·m_mul^i); warmup_cosine → warmup_cosine_decay_schedule; sequential → join_schedules;
chained → the product of its parts' schedules (optax has no chain); reduce_on_plateau →
optax.contrib.reduce_on_plateau observing each metric (mode "min" only; rel threshold → rtol, abs →
atol; min_lr → min_scale = min_lr / lr, per group; eps = 0 only: optax applies every reduction). optax has no inverse_sqrt, wsd or cyclic schedule;
`unit = "epoch"` evaluates at count // updates_per_epoch.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from conformance.config import OptimizerSpec, ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import check_metrics, check_schedule, spots
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
    end = None if spec.end_factor is None else base * spec.end_factor
    if n == "step":
        return optax.exponential_decay(base, spec.step_size, spec.gamma, staircase=True, end_value=end)
    if n == "multistep":
        return optax.piecewise_constant_schedule(base, {m: spec.gamma for m in spec.milestones})
    if n == "exponential":
        return optax.exponential_decay(base, 1, spec.gamma, end_value=end)
    if n == "cosine":
        return optax.cosine_decay_schedule(base, spec.t_max, alpha=spec.eta_min / base)
    if n == "linear":
        return optax.linear_schedule(base * spec.start_factor, base * spec.end_factor, spec.total_iters)
    if n == "polynomial":
        return optax.polynomial_schedule(base, end, spec.power, spec.total_iters)
    if n == "onecycle":
        return _onecycle(spec, base)
    if n == "cosine_restarts":
        lengths, t = [], spec.t_0
        while sum(lengths) < horizon:
            lengths.append(t)
            t *= spec.t_mult
        peaks = [spec.eta_min + (base - spec.eta_min) * spec.m_mul ** i for i in range(len(lengths))]
        return optax.sgdr_schedule([dict(init_value=b, peak_value=b, warmup_steps=0, decay_steps=n_,
                                         end_value=spec.eta_min) for b, n_ in zip(peaks, lengths)])
    if n == "warmup_cosine":
        require(spec, "schedule", "convention", ("optax",), "optax.warmup_cosine_decay_schedule")
        return optax.warmup_cosine_decay_schedule(base * spec.start_factor, base, spec.warmup_steps,
                                                  spec.total_steps, spec.eta_min)
    if n == "sequential":
        return optax.join_schedules([_make(p, base, horizon) for p in spec.schedulers], spec.milestones)
    if n == "chained":
        parts = [_make(p, 1.0, horizon) for p in spec.schedulers or []]
        return lambda count: base * functools.reduce(operator.mul, [f(count) for f in parts])
    if n == "reduce_on_plateau":
        raise refuse("schedule.name = 'reduce_on_plateau'", "optax.contrib.reduce_on_plateau observes a metric; "
                                                            "the update path observes none")
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


def plateau(spec: ScheduleSpec, base: float, floor: float) -> optax.GradientTransformationExtraArgs:
    """optax.contrib.reduce_on_plateau for torch's ReduceLROnPlateau fields (its scale times `base`),
    for the param group whose lr floor (min_lr) is `floor`."""
    require(spec, "schedule", "mode", ("min",), "optax.contrib.reduce_on_plateau (it minimizes)")
    # optax applies every reduction however small: torch's eps = 0, not its 1e-8 default
    require(spec, "schedule", "eps", (0.0,), "optax.contrib.reduce_on_plateau (no eps: every reduction applies)")
    rel = spec.threshold_mode == "rel"
    return optax.contrib.reduce_on_plateau(factor=spec.factor, patience=spec.patience,
                                           rtol=spec.threshold if rel else 0.0, atol=0.0 if rel else spec.threshold,
                                           cooldown=spec.cooldown, min_scale=floor / base)


def _plateau_values(schedule: ScheduleSpec, bases: list[float], observed: Any, rows: np.ndarray) -> np.ndarray:
    per_group = schedule.min_lr if isinstance(schedule.min_lr, list) else [schedule.min_lr] * len(bases)
    txs = [plateau(schedule, b, f) for b, f in zip(bases, per_group)]
    dummy = {"p": jnp.zeros(())}
    out = []
    for b, tx in zip(bases, txs):  # the plateau's update jitted once, stepped on the host as in a training loop
        step, st, scales = jax.jit(lambda s, v, tx=tx: tx.update(dummy, s, value=v)[1]), tx.init(dummy), []
        for t in range(int(rows[-1]) + 1):
            scales.append(b * float(st.scale))
            if observed is not None:
                st = step(st, jnp.asarray(observed[t]))
        out.append(scales)
    return np.array(out).T[rows]


def schedule_values(schedule: ScheduleSpec, optimizer: OptimizerSpec, steps: int, updates_per_epoch: int = 1, *,
                    at: list[int] | None = None, metrics: list[float] | None = None) -> dict[str, Any]:
    """Every group's lr at optax counts 0..steps-1 (or the `at` counts; int32, as optax's state holds
    them); no momentum. reduce_on_plateau: the base lr times the plateau's scale after the metrics
    observed so far."""
    check_schedule(schedule, optimizer, steps, updates_per_epoch)
    observed = check_metrics(schedule, metrics, steps)
    rows = spots(steps, at)
    if schedule.name == "reduce_on_plateau":
        return {"lr": _plateau_values(schedule, group_base_lrs(optimizer), observed, rows), "momentum": None}
    fns = [schedule_fn(schedule, lr, steps, updates_per_epoch) for lr in group_base_lrs(optimizer)]
    counts = jnp.asarray(rows, jnp.int32)  # optax's int32 count; each schedule compiled once over every count
    lr = [np.asarray(jax.jit(jax.vmap(f))(counts), np.float64) for f in fns]
    return {"lr": np.stack(lr, axis=1), "momentum": None}
