"""Optax schedules for a ScheduleSpec (JAX only; the torch twin builds lr_scheduler objects).

Each group gets one jittable callable count -> lr, built from optax schedules where optax has the
same mathematics (exponential_decay, piecewise_constant_schedule, linear_schedule,
polynomial_schedule, cosine_decay_schedule, warmup_cosine_decay_schedule, join_schedules) and from
small closed forms where it has none or differs (torch's cosine past t_max, OneCycleLR's
fractional phase ends, warm restarts for ever, inverse sqrt, wsd's 1 − sqrt decay).

Exact in float64: optax counters are int32, and int32 / int is float32 even with x64 on
(reference/semantics.md §0.2), so every schedule first casts the count to the default float type
(float64 under `jax.enable_x64`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax

from conformance.config.schedule import ScheduleSpec
from conformance.errors import InputError
from conformance.rules.schedules import onecycle_phases, start_lrs

Schedule = Callable[[Any], Any]


class GroupSchedules(NamedTuple):
    """One optax schedule (count -> value) per param group: `lr`, and `momentum` (onecycle with
    cycle_momentum: the momentum or beta1 to inject; None otherwise). Feed them the optimizer's
    update count, e.g. through optax.inject_hyperparams."""

    lr: tuple[Schedule, ...]
    momentum: tuple[Schedule, ...] | None


def schedule_step(count: Any, updates_per_epoch: int = 1) -> Any:
    """The schedule step of update `count` as a float (float64 under x64): count // updates_per_epoch."""
    count = jnp.asarray(count)
    if updates_per_epoch != 1:
        count = count // updates_per_epoch
    return count.astype(jnp.result_type(float))


def _affine(low: float, high: float, unit: Schedule) -> Schedule:
    """low + (high - low)·unit(s): every group anneals from its own lr to the absolute eta_min."""
    return lambda s: low + (high - low) * unit(s)


def _torch_cosine(b: float, eta: float, t_max: int) -> Schedule:
    unit = optax.cosine_decay_schedule(1.0, t_max)  # (1 + cos(π s / t_max)) / 2, clamped at t_max

    def schedule(s: Any) -> Any:
        # torch keeps following the cosine past t_max (back up to b at 2·t_max): fold s into [0, t_max]
        u = jnp.mod(s, 2 * t_max)
        return eta + (b - eta) * unit(jnp.minimum(u, 2 * t_max - u))

    return schedule


def _restarts(spec: ScheduleSpec, b: float) -> Schedule:
    t0, mult, eta = spec.t_0, spec.t_mult, spec.eta_min
    starts, lengths = [0], [t0]
    while mult > 1 and starts[-1] <= 2**53:  # cycle starts as exact integers (float64-exact range)
        starts.append(starts[-1] + lengths[-1])
        lengths.append(lengths[-1] * mult)
    starts_a, lengths_a = np.asarray(starts, np.float64), np.asarray(lengths, np.float64)

    def schedule(s: Any) -> Any:
        if mult == 1:
            t_cur, t_i = jnp.mod(s, t0), t0
        else:
            i = jnp.searchsorted(jnp.asarray(starts_a, s.dtype), s, side="right") - 1
            t_cur, t_i = s - jnp.asarray(starts_a, s.dtype)[i], jnp.asarray(lengths_a, s.dtype)[i]
        return eta + (b - eta) * (1 + jnp.cos(jnp.pi * t_cur / t_i)) / 2

    return schedule


def _phase(kind: str, start: float, end: float, length: float) -> Schedule:
    if kind == "linear":
        return optax.linear_schedule(start, end, length)  # type: ignore[arg-type]
    return _affine(end, start, optax.cosine_decay_schedule(1.0, length))  # type: ignore[arg-type]


def _onecycle(spec: ScheduleSpec, phases: list[tuple[float, float, float]]) -> Schedule:
    # torch's phase ends are floats (pct·T − 1, ...): join_schedules restarts each phase there
    parts, bounds, begin = [], [], 0.0
    for end, a, b in phases:
        parts.append(_phase(spec.anneal_strategy, a, b, end - begin))
        bounds.append(end)
        begin = end
    return optax.join_schedules(parts, bounds[:-1])


def _warmup(spec: ScheduleSpec, b: float) -> Schedule:
    return optax.linear_schedule(b * spec.start_factor, b, spec.warmup_steps)


def _wsd(spec: ScheduleSpec, b: float) -> Schedule:
    w, d, total, eta = spec.warmup_steps, spec.decay_steps, spec.total_steps, spec.eta_min
    if spec.decay_type == "linear":
        decay = optax.linear_schedule(b, eta, d)
    elif spec.decay_type == "cosine":
        decay = _affine(eta, b, optax.cosine_decay_schedule(1.0, d))
    else:
        decay = _affine(eta, b, lambda u: 1.0 - jnp.sqrt(jnp.clip(u / d, 0.0, 1.0)))
    return optax.join_schedules([_warmup(spec, b), optax.constant_schedule(b), decay], [w, total - d])


def lr_schedule(spec: ScheduleSpec, b: float) -> Schedule:
    """One group's schedule as a function of the float schedule step s (see schedule_step)."""
    name = spec.name
    if name == "constant":
        if spec.factor is None:
            return optax.constant_schedule(b)
        return optax.piecewise_constant_schedule(b * spec.factor, {spec.total_iters: 1.0 / spec.factor})
    if name == "step":
        return optax.exponential_decay(b, spec.step_size, spec.gamma, staircase=True)
    if name == "multistep":
        return optax.piecewise_constant_schedule(b, {m: spec.gamma for m in spec.milestones})
    if name == "exponential":
        return optax.exponential_decay(b, 1, spec.gamma)
    if name == "cosine":
        return _torch_cosine(b, spec.eta_min, spec.t_max)
    if name == "linear":
        return optax.linear_schedule(b * spec.start_factor, b * spec.end_factor, spec.total_iters)
    if name == "polynomial":
        return optax.polynomial_schedule(b, 0.0, spec.power, spec.total_iters)
    if name == "onecycle":
        return _onecycle(spec, onecycle_phases(spec, b))
    if name == "cosine_restarts":
        return _restarts(spec, b)
    if name == "warmup_cosine":
        w, total, eta = spec.warmup_steps, spec.total_steps, spec.eta_min
        if spec.convention == "optax":
            return optax.warmup_cosine_decay_schedule(b * spec.start_factor, b, w, total, eta)
        return optax.join_schedules([_warmup(spec, b), _torch_cosine(b, eta, total - w)], [w])
    if name == "inverse_sqrt":
        w, tau = spec.warmup_steps, spec.timescale
        decay = lambda u: b * jnp.sqrt(tau / jnp.maximum(u + tau, 1.0))  # noqa: E731
        return optax.join_schedules([_warmup(spec, b), decay], [w])
    if name == "wsd":
        return _wsd(spec, b)
    if name == "sequential":
        # join_schedules restarts each part at its milestone, exactly as torch's SequentialLR
        return optax.join_schedules([lr_schedule(p, b) for p in spec.schedulers], list(spec.milestones))
    raise InputError(f"schedule.name {name!r} has no optax schedule")


def _counted(schedule: Schedule, updates_per_epoch: int) -> Schedule:
    return lambda count: schedule(schedule_step(count, updates_per_epoch))


def build_schedules(spec: ScheduleSpec, base_lrs: Sequence[float], updates_per_epoch: int = 1) -> GroupSchedules:
    """Optax schedules for every param group (base lrs in group order, default group last): each a
    jittable count -> value with the count taken as optimizer updates (int32 is fine: it is cast)."""
    if updates_per_epoch < 1 or (spec.unit == "update" and updates_per_epoch != 1):
        raise InputError(f"updates_per_epoch must be 1 for unit = 'update' and >= 1 for unit = "
                         f"'epoch'; received {updates_per_epoch}")
    lr = tuple(_counted(lr_schedule(spec, b), updates_per_epoch) for b in start_lrs(spec, list(base_lrs)))
    momentum = None
    if spec.name == "onecycle" and spec.cycle_momentum:
        cycle = _counted(_onecycle(spec, onecycle_phases(spec, 1.0, momentum=True)), updates_per_epoch)
        momentum = tuple(cycle for _ in lr)
    return GroupSchedules(lr, momentum)
