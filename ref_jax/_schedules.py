"""The lr schedule of a ScheduleSpec in each framework's own form, counted in optimizer updates, and
reduce_on_plateau's state to and from its neutral form (conformance.rules.plateau).

Each schedule is torch.optim.lr_scheduler's of the same meaning (StepLR, CosineAnnealingLR,
OneCycleLR, SequentialLR, ChainedScheduler, CyclicLR, ReduceLROnPlateau, ...), with the variants a
spec may ask for where torch has none: optax's end values (polynomial, exponential, step with
end_factor), warmup_cosine's hold at eta_min after total_steps (convention "optax"), Keras's
restart multiplier (cosine_restarts with m_mul != 1), inverse_sqrt's and wsd's decays. `unit =
"epoch"` advances a schedule once every `updates_per_epoch` updates. reduce_on_plateau is no
function of the count: the lrs hold between observed metrics and move by torch's
ReduceLROnPlateau rule when one is observed (docs/divergences.md S-PLATEAU: not optax's).
"""

# Optax schedules: each group gets one jittable callable count -> lr, built from optax schedules
# where optax has the same mathematics (exponential_decay with its end_value but for the
# staircase, piecewise_constant_schedule, cosine_decay_schedule, warmup_cosine_decay_schedule, join_schedules) and from small closed forms
# where it has none or differs (linear and polynomial decays exact at their end under jit, torch's
# cosine past t_max, OneCycleLR's fractional phase ends, warm
# restarts for ever with Keras's m_mul, inverse sqrt, wsd's 1 − sqrt decay, ChainedScheduler's
# product of factors, CyclicLR's triangles).
#
# reduce_on_plateau: `plateau_step` is torch's ReduceLROnPlateau as one pure, jittable step over a
# NamedTuple state (`PlateauState`), fed each observed metric. optax.contrib.reduce_on_plateau is
# not used: it reduces after `patience` bad values (torch after patience + 1), knows only "min"
# with rtol and atol together, scales all updates by one factor with a relative floor (torch:
# every group's lr, an absolute min_lr and eps) and can average several values before deciding.
#
# Exact in float64: optax counters are int32, and int32 / int is float32 even with x64 on
# (reference/semantics.md §0.2), so every schedule first casts the count to the default float type
# (float64 under `jax.enable_x64`).

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import optax

from conformance.config.schedule import ScheduleSpec
from conformance.errors import InputError
from conformance.rules.plateau import Plateau
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


def _polynomial(init: float, end: float, power: float, steps: float) -> Schedule:
    """optax.polynomial_schedule(init, end, power, steps) (linear_schedule for power 1) with the
    fraction left written (T − s)/T instead of 1 − s/T: jitted, XLA:CPU turns 1 − s/T into a fused
    multiply-add of s·(1/T), which at s = T = 10 is −5.6e-17 in float64 (−1.5e-8 in float32): a
    fractional power of it is NaN, a linear decay to 0 a negative lr (docs/divergences.md
    S-POLY-JIT). T − s is exactly 0 from the end on."""
    def schedule(s: Any) -> Any:
        left = steps - jnp.clip(s, 0, steps)
        return (init - end) * jnp.minimum(left / steps, 1.0) ** power + end  # T·(1/T) may round above 1
    return schedule


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
            i, t_cur, t_i = s // t0, jnp.mod(s, t0), t0  # floor(s / t0) is not exact under XLA (S-STAIRCASE)
        else:
            i = jnp.searchsorted(jnp.asarray(starts_a, s.dtype), s, side="right") - 1
            t_cur, t_i = s - jnp.asarray(starts_a, s.dtype)[i], jnp.asarray(lengths_a, s.dtype)[i]
        peak = (b - eta) * spec.m_mul ** i if spec.m_mul != 1 else b - eta  # Keras's m_mul per restart
        return eta + peak * (1 + jnp.cos(jnp.pi * t_cur / t_i)) / 2

    return schedule


def _phase(kind: str, start: float, end: float, length: float) -> Schedule:
    if kind == "linear":
        return _polynomial(start, end, 1.0, length)  # type: ignore[arg-type]
    return _affine(end, start, optax.cosine_decay_schedule(1.0, length))  # type: ignore[arg-type]


def _onecycle(spec: ScheduleSpec, phases: list[tuple[float, float, float]]) -> Schedule:
    # torch's phase ends are floats (pct·T − 1, ...): join_schedules restarts each phase there
    parts, bounds, begin = [], [], 0.0
    for end, a, b in phases:
        parts.append(_phase(spec.anneal_strategy, a, b, end - begin))
        bounds.append(end)
        begin = end
    return optax.join_schedules(parts, bounds[:-1])


def _cyclic_height(spec: ScheduleSpec) -> Schedule:
    """torch's CyclicLR: the fraction of the amplitude at schedule step s (mode's scale included)."""
    total = float(spec.step_size_up + spec.step_size_down)
    ratio = spec.step_size_up / total

    def height(s: Any) -> Any:
        cycle = 1 + s // total  # exact; jnp.floor(s / total) is not (S-STAIRCASE)
        x = 1.0 + s / total - cycle
        h = jnp.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        if spec.mode == "triangular2":
            return h * (1 / (2.0 ** (cycle - 1)))
        if spec.mode == "exp_range":
            return h * spec.gamma ** s
        return h

    return height


def _staircase(b: float, k: int, gamma: float, end: float | None) -> Schedule:
    """StepLR / optax.exponential_decay(staircase=True, end_value): b·γ^⌊s/k⌋, bounded by `end`. Not
    optax's: its floor(count / k) lands one step early at some boundaries under a float64 count,
    where XLA multiplies by 1/k (docs/divergences.md S-STAIRCASE); s // k is exact."""

    def schedule(s: Any) -> Any:
        value = b * gamma ** (s // k)
        if end is None:
            return value
        return jnp.maximum(value, end) if gamma < 1 else jnp.minimum(value, end)

    return schedule


def _chained(spec: ScheduleSpec, b: float) -> Schedule:
    # ChainedScheduler: every part multiplies the lr by its own factor (its schedule for a base lr of 1)
    factors = [lr_schedule(p, 1.0) for p in spec.schedulers]  # type: ignore[union-attr]

    def schedule(s: Any) -> Any:
        out = b
        for f in factors:
            out = out * f(s)
        return out

    return schedule


def _tabulated(factors: Sequence[float], b: float) -> Schedule:
    # b · factors[s], the last factor held: one gather, the product rounded once as torch's LambdaLR
    table = np.asarray(factors, dtype=np.float64)

    def schedule(s: Any) -> Any:
        index = jnp.clip(jnp.asarray(s), 0, len(table) - 1).astype(jnp.int32)
        return b * jnp.asarray(table)[index]

    return schedule


def _warmup(spec: ScheduleSpec, b: float) -> Schedule:
    return _polynomial(b * spec.start_factor, b, 1.0, spec.warmup_steps)


def _wsd(spec: ScheduleSpec, b: float) -> Schedule:
    w, d, total, eta = spec.warmup_steps, spec.decay_steps, spec.total_steps, spec.eta_min
    if spec.decay_type == "linear":
        decay = _polynomial(b, eta, 1.0, d)
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
    end = None if spec.end_factor is None else b * spec.end_factor  # optax's end_value
    if name == "step":
        return _staircase(b, spec.step_size, spec.gamma, end)
    if name == "multistep":
        return optax.piecewise_constant_schedule(b, {m: spec.gamma for m in spec.milestones})
    if name == "exponential":
        return optax.exponential_decay(b, 1, spec.gamma, end_value=end)
    if name == "cosine":
        return _torch_cosine(b, spec.eta_min, spec.t_max)
    if name == "linear":
        return _polynomial(b * spec.start_factor, b * spec.end_factor, 1.0, spec.total_iters)
    if name == "polynomial":
        return _polynomial(b, end, spec.power, spec.total_iters)
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
    if name == "chained":
        return _chained(spec, b)
    if name == "cyclic":
        height = _cyclic_height(spec)
        return lambda s: b + (spec.max_lr - b) * height(s)
    if name == "reduce_on_plateau":
        return optax.constant_schedule(b)  # between observations the lr holds; plateau_step moves it
    if name == "tabulated":
        return _tabulated(spec.factors, b)
    raise InputError(f"schedule.name {name!r} has no optax schedule")


def _counted(schedule: Schedule, updates_per_epoch: int) -> Schedule:
    return lambda count: schedule(schedule_step(count, updates_per_epoch))


def build_scheduler(spec: ScheduleSpec, base_lrs: Sequence[float], updates_per_epoch: int = 1) -> GroupSchedules:
    """Every param group's lr schedule for `spec` (and its cycled momentum or beta1, where the
    spec cycles one), advanced once per optimizer update (not on updates skipped under
    precision.schedule_on_skip = "hold")."""
    # Optax schedules, base lrs in group order (default group last): each a jittable count -> value
    # with the count taken as optimizer updates (int32 is fine: it is cast); the caller feeds them
    # the count of updates that advanced the schedule.
    if updates_per_epoch < 1 or (spec.unit == "update" and updates_per_epoch != 1):
        raise InputError(f"updates_per_epoch must be 1 for unit = 'update' and >= 1 for unit = "
                         f"'epoch'; received {updates_per_epoch}")
    lr = tuple(_counted(lr_schedule(spec, b), updates_per_epoch) for b in start_lrs(spec, list(base_lrs)))
    momentum = None
    if spec.name == "onecycle" and spec.cycle_momentum:
        cycle = _counted(_onecycle(spec, onecycle_phases(spec, 1.0, momentum=True)), updates_per_epoch)
        momentum = tuple(cycle for _ in lr)
    if spec.name == "cyclic" and spec.cycle_momentum:
        hi, lo, height = spec.max_momentum, spec.base_momentum, _cyclic_height(spec)
        cycle = _counted(lambda s: hi - (hi - lo) * height(s), updates_per_epoch)  # inverse to the lr
        momentum = tuple(cycle for _ in lr)
    return GroupSchedules(lr, momentum)


def build_hyper(spec: ScheduleSpec, bases: Mapping[str, Sequence[float | None]],
                updates_per_epoch: int = 1) -> dict[str, tuple[Schedule | None, ...]]:
    """[schedule.hyper]'s schedules for every param group whose optimizer reads the key, each from
    the group's own value as the lr schedule is from its lr, advanced with the lr (the same
    position; held with it on skipped updates). Without schedule.hyper: the lr's alone."""
    # JAX: {key: one schedule per group (None where the group does not read the key)} from `bases`
    # (conformance.rules.schedules.hyper_bases), fed the count of updates that advanced the lr;
    # empty without schedule.hyper.
    return {key: tuple(None if b is None else _counted(lr_schedule(spec.hyper[key], b), updates_per_epoch)
                       for b in values)  # type: ignore[index]
            for key, values in bases.items()}


class PlateauState(NamedTuple):
    """reduce_on_plateau's state (torch's ReduceLROnPlateau attributes): the best metric so far,
    the bad observations since, the cooldown left, the metrics observed and every group's lr."""

    best: Any
    num_bad_epochs: Any
    cooldown_counter: Any
    observed: Any
    lrs: Any


def plateau_init(spec: ScheduleSpec, base_lrs: Sequence[float]) -> PlateauState:
    """Before any metric: best is the worst value of the mode, the groups at their base lr."""
    best = jnp.inf if spec.mode == "min" else -jnp.inf
    return PlateauState(jnp.asarray(best), jnp.asarray(0), jnp.asarray(0), jnp.asarray(0),
                        jnp.asarray(list(base_lrs), jnp.result_type(float)))


def plateau_step(spec: ScheduleSpec, state: PlateauState, metric: Any) -> PlateauState:
    """Observe one metric (torch's ReduceLROnPlateau.step): better → new best; else one more bad
    observation; in cooldown bad ones are ignored; more than `patience` bad ones multiply every
    lr by `factor` (not below min_lr, and only where it falls by more than eps), then cooldown."""
    th = spec.threshold
    if spec.mode == "min":
        better = metric < (state.best * (1 - th) if spec.threshold_mode == "rel" else state.best - th)
    else:
        better = metric > (state.best * (1 + th) if spec.threshold_mode == "rel" else state.best + th)
    best = jnp.where(better, metric, state.best)
    bad = jnp.where(better, 0, state.num_bad_epochs + 1)
    cooling = state.cooldown_counter > 0
    cooldown = jnp.where(cooling, state.cooldown_counter - 1, state.cooldown_counter)
    bad = jnp.where(cooling, 0, bad)
    reduce = bad > spec.patience
    lower = jnp.maximum(state.lrs * spec.factor, jnp.asarray(spec.min_lr, state.lrs.dtype))  # one floor or one per group
    lrs = jnp.where(reduce & (state.lrs - lower > spec.eps), lower, state.lrs)
    return PlateauState(best, jnp.where(reduce, 0, bad), jnp.where(reduce, spec.cooldown, cooldown),
                        state.observed + 1, lrs)


def plateau_neutral(state: PlateauState) -> Plateau:
    """The neutral plateau state (conformance.rules.plateau): best, bad observations, cooldown,
    observations and every group's lr."""
    lrs = tuple(float(x) for x in np.asarray(state.lrs, np.float64))
    return Plateau(float(state.best), int(state.num_bad_epochs), int(state.cooldown_counter),
                   int(state.observed), lrs)


def plateau_from_neutral(state: Plateau) -> PlateauState:
    """The plateau state from its neutral form (conformance.rules.plateau), lrs included."""
    # a new PlateauState
    return PlateauState(jnp.asarray(state.best), jnp.asarray(state.num_bad_epochs),
                        jnp.asarray(state.cooldown_counter), jnp.asarray(state.observed),
                        jnp.asarray(state.lrs, jnp.result_type(float)))
