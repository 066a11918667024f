"""Learning-rate schedules in NumPy float64, in closed form (torch's semantics where torch has a class).

Notation: b is a group's base lr (onecycle: its peak, `max_lr` or the base lr), s the schedule
step: s = t for unit = "update", s = t // updates_per_epoch for unit = "epoch". Update t applies
the value at s (docs/contract.md §2). W = warmup_steps, T = total_steps, η = eta_min, sf = start_factor.

The formulas below are the mathematics; each is evaluated so that it keeps its digits where the
value is small (tests/test_schedules_exact.py: ≤ 1e-12 relative against mpmath at 60 digits):
(1 + cos x)/2 as cos²(x/2) or sin² of the complementary angle, 1 − s/n as (n − s)/n, an
interpolation from start to end as start·w + end·(1 − w), CyclicLR's position in its cycle in
integers. torch and optax evaluate them as written and lose digits there (docs/divergences.md).

    constant        b; with factor f: b·f for s < total_iters, then b             (ConstantLR)
    step            b·γ^⌊s / step_size⌋; with end_factor e: b·max(γ^⌊s/k⌋, e) (γ < 1) or
                    b·min(γ^⌊s/k⌋, e) (γ > 1), optax's end_value                     (StepLR)
    multistep       b·γ^(number of milestones <= s)                                 (MultiStepLR)
    exponential     b·γ^s; with end_factor e bounded as step is                     (ExponentialLR)
    cosine          η + (b − η)·(1 + cos(π s / t_max))/2, for every s: past t_max it climbs back
                    to b at 2·t_max, as torch's CosineAnnealingLR does                (CosineAnnealingLR)
    linear          b·(sf + (ef − sf)·min(s, n)/n), n = total_iters; sf, ef may exceed 1 (LinearLR)
    polynomial      b·(ef + (1 − ef)·(1 − min(s, n)/n)^power), ef = end_factor (torch: 0) (PolynomialLR)
    onecycle        torch's OneCycleLR: phases ending at the (float) steps pct·T − 1 [, 2·pct·T − 2]
                    and T − 1; in each, value = anneal(start, end, (s − s0)/(s1 − s0)) with
                    cos: end + (start − end)(1 + cos(π·pct))/2, linear: start + (end − start)·pct;
                    lr: b/div → b → b/(div·final_div) (three-phase: → b/div → b/(div·final_div));
                    momentum: max → base → max (three-phase: max → base → max → max)
    cosine_restarts η + (b − η)·m^i·(1 + cos(π T_cur / T_i))/2, T_i = t_0·t_mult^i, T_cur = s − start
                    of cycle i, m = m_mul (Keras's CosineDecayRestarts; torch: 1) (restarts for ever,
                    exact integer cycle arithmetic)                        (CosineAnnealingWarmRestarts)
    warmup_cosine   s <= W: b·(sf + (1 − sf)·s/W); s >= W: η + (b − η)(1 + cos(π u/(T − W)))/2 with
                    u = s − W; convention "optax" holds η from s = T on (u <= T − W), "torch" keeps
                    following the cosine. Update W is the first to use the peak lr b.
    inverse_sqrt    s < W: b·(sf + (1 − sf)·s/W); s >= W: b·sqrt(τ/(s − W + τ)), τ = timescale (= W)
    wsd             s < W: warm-up as above; W <= s < T − D: b; then p = min((s − T + D)/D, 1) and
                    η + (b − η)·shape(p), shape = 1 − p | (1 + cos πp)/2 | 1 − sqrt(p); η from s = T on
    sequential      part i = number of milestones <= s, run at s − milestones[i−1] (a part restarts
                    from its own step 0 at its milestone, as in torch's SequentialLR)
    chained         b·Π_i f_i(s), f_i = part i for a base lr of 1 (torch's ChainedScheduler: each
                    chainable part multiplies the current lr by its own ratio)
    cyclic          torch's CyclicLR with U = step_size_up, D = step_size_down, a = base_lr (or b):
                    c = ⌊1 + s/(U + D)⌋, x = 1 + s/(U + D) − c, r = U/(U + D),
                    h = x/r if x <= r else (x − 1)/(r − 1), lr = a + (max_lr − a)·h·g with
                    g = 1 (triangular), 1/2^(c − 1) (triangular2), γ^s (exp_range);
                    momentum: max_momentum − (max_momentum − base_momentum)·h·g
    reduce_on_plateau  lr_g starts at b; after update t the metric m_t is observed: better when
                    m_t < best·(1 − θ) (min, rel), < best − θ (min, abs), > best·(1 + θ) (max, rel),
                    > best + θ (max, abs), best starting at ±inf; better: best = m_t, bad = 0,
                    else bad += 1; in cooldown: cooldown −= 1, bad = 0; if bad > patience:
                    lr_g = max(lr_g·factor, min_lr) where that lowers lr_g by more than eps,
                    cooldown = cooldown steps, bad = 0                    (ReduceLROnPlateau)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conformance.config.schedule import ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import (
    check_metrics,
    check_schedule,
    cycled_hyperparameter,
    hyper_bases,
    onecycle_phases,
    spots,
    start_lrs,
)

Fn = Callable[[np.ndarray], np.ndarray]  # schedule step s (int64 array) -> value (float64 array)


def _warmup(b: float, sf: float, w: int) -> Fn:
    # b·(sf + (1 − sf)·s/W) as b·(sf·(W − s) + s)/W: two terms >= 0, no 1 − s/W that cancels near s = W
    return lambda s: b * (sf * (w - s) + s) / w if w > 0 else np.full(s.shape, b)


def _half_cos(a: Any, c: Any, d: Any) -> np.ndarray:
    """(1 + cos(π·a/d))/2 where a + c = d, a, c >= 0: cos²(π·a/2d) or sin²(π·c/2d), whichever
    argument is the smaller, so that no 1 + cos(·) cancels near the trough (at a = d − 1 and d = 10⁶
    that sum keeps 4 digits)."""
    a, c = np.asarray(a, np.float64), np.asarray(c, np.float64)
    return np.where(a <= c, np.cos(np.pi * a / (2 * d)) ** 2, np.sin(np.pi * c / (2 * d)) ** 2)


def _cosine(b: float, eta: float, length: int) -> Fn:
    def fn(u: np.ndarray) -> np.ndarray:
        r = np.mod(u, 2 * length)  # the cosine's period is 2·length (torch's climbs back) and it is even
        a = np.minimum(r, 2 * length - r)
        return eta + (b - eta) * _half_cos(a, length - a, length)

    return fn


def warmup_cosine(spec: ScheduleSpec, b: float) -> Fn:
    """Linear warm-up, then cosine annealing, in closed form (W = warmup_steps, T = total_steps):

        s <= W: b·(sf + (1 − sf)·s/W)        s >= W: η + (b − η)(1 + cos(π (s − W)/(T − W)))/2

    Update 0 applies b·start_factor; update W is the first to apply the peak b (every earlier
    update applies less when start_factor < 1); update T is the first to apply η. After T,
    convention "optax" (optax.warmup_cosine_decay_schedule(b·sf, b, W, T, η)) holds η and
    "torch" (SequentialLR([LinearLR(sf, 1, W), CosineAnnealingLR(T − W, η)], [W])) follows torch's
    cosine back up; both agree for s <= T. Porting: transformers' get_cosine_schedule_with_warmup
    is start_factor 0; nanoGPT's lr·(it + 1)/(W + 1) is start_factor 1/(W + 1); seed 000's
    η_max·t/W with t counted from 1 is warmup_steps W − 1, start_factor 1/W (peak at update W − 1)."""
    w, total = spec.warmup_steps, spec.total_steps
    warm, cos = _warmup(b, spec.start_factor, w), _cosine(b, spec.eta_min, total - w)
    hold = spec.convention == "optax"
    return lambda s: np.where(s < w, warm(s), cos(np.minimum(s, total) - w if hold else s - w))


def _restarts(spec: ScheduleSpec, b: float) -> Fn:
    t0, mult, eta = spec.t_0, spec.t_mult, spec.eta_min

    def fn(s: np.ndarray) -> np.ndarray:
        if mult == 1:
            i, t_cur, t_i = s // t0, s % t0, np.full(s.shape, t0)
        else:
            starts, lengths = [0], [t0]
            while starts[-1] <= s.max(initial=0):
                starts.append(starts[-1] + lengths[-1])
                lengths.append(lengths[-1] * mult)
            i = np.searchsorted(np.asarray(starts), s, side="right") - 1
            t_cur, t_i = s - np.asarray(starts)[i], np.asarray(lengths)[i]
        return eta + (b - eta) * spec.m_mul ** i * _half_cos(t_cur, t_i - t_cur, t_i)

    return fn


def _bounded(gamma: float, end: float | None, value: np.ndarray) -> np.ndarray:
    # optax's end_value: a floor for a decay (gamma < 1), a ceiling for a growth
    if end is None:
        return value
    return np.maximum(value, end) if gamma < 1 else np.minimum(value, end)


def _cyclic_height(spec: ScheduleSpec, s: np.ndarray) -> np.ndarray:
    """torch's CyclicLR: the fraction h·g of the amplitude at schedule step s."""
    up, down = spec.step_size_up, spec.step_size_down
    # torch's x = 1 + s/(U + D) − cycle, in integers: q = s mod (U + D) steps into the cycle, so that
    # no float 1 + s/(U + D) − cycle loses the digits of x late in a run
    q = np.mod(s, up + down)
    h = np.where(q <= up, q / up, (up + down - q) / down)
    if spec.mode == "triangular":
        return h
    if spec.mode == "triangular2":
        return h * np.ldexp(1.0, -(s // (up + down)))  # 2^−(cycle − 1), 0 once it underflows
    return h * spec.gamma ** s.astype(np.float64)


def _anneal(kind: str, start: float, end: float, a: np.ndarray, c: np.ndarray, d: float) -> np.ndarray:
    # torch's end + (start − end)·(1 + cos(π·pct))/2 and (end − start)·pct + start, pct = a/d, c = d − a,
    # as start·w + end·(1 − w): two terms >= 0, so that an anneal to end = start/10⁴ keeps its digits
    if kind == "cos":
        return start * _half_cos(a, c, d) + end * _half_cos(c, a, d)
    return start * (c / d) + end * (a / d)


def _onecycle(spec: ScheduleSpec, phases: list[tuple[float, float, float]]) -> Fn:
    def fn(s: np.ndarray) -> np.ndarray:
        out = np.zeros(s.shape)
        done = np.zeros(s.shape, bool)
        begin = 0.0
        for i, (end, a, b) in enumerate(phases):
            here = ~done & ((s <= end) | (i == len(phases) - 1))
            out = np.where(here, _anneal(spec.anneal_strategy, a, b, s - begin, end - s, end - begin), out)
            done |= here
            begin = end
        return out

    return fn


def _wsd(spec: ScheduleSpec, b: float) -> Fn:
    w, d, total, eta = spec.warmup_steps, spec.decay_steps, spec.total_steps, spec.eta_min
    warm = _warmup(b, spec.start_factor, w)

    def fn(s: np.ndarray) -> np.ndarray:
        a = np.clip(s - (total - d), 0, d)  # p = a/d, and 1 − p = (d − a)/d without a subtraction from 1
        if spec.decay_type == "linear":
            shape = (d - a) / d
        elif spec.decay_type == "cosine":
            shape = _half_cos(a, d - a, d)
        else:
            shape = (d - a) / d / (1 + np.sqrt(a / d))  # 1 − √p = (1 − p)/(1 + √p)
        decay = eta + (b - eta) * shape
        return np.where(s < w, warm(s), np.where(s < total - d, b, decay))

    return fn


def lr_function(spec: ScheduleSpec, b: float) -> Fn:
    """The closed form of `spec` for one group, as a function of the schedule step s."""
    name = spec.name
    if name == "constant":
        if spec.factor is None:
            return lambda s: np.full(s.shape, b)
        return lambda s: np.where(s < spec.total_iters, b * spec.factor, b)
    if name == "step":
        return lambda s: b * _bounded(spec.gamma, spec.end_factor, spec.gamma ** (s // spec.step_size))
    if name == "multistep":
        return lambda s: b * spec.gamma ** np.searchsorted(np.asarray(spec.milestones), s, side="right")
    if name == "exponential":
        return lambda s: b * _bounded(spec.gamma, spec.end_factor, spec.gamma ** s.astype(np.float64))
    if name == "cosine":
        return _cosine(b, spec.eta_min, spec.t_max)
    if name == "linear":
        n, sf, ef = spec.total_iters, spec.start_factor, spec.end_factor
        return lambda s: b * (sf * (n - np.minimum(s, n)) + ef * np.minimum(s, n)) / n  # both terms >= 0
    if name == "polynomial":
        n, ef = spec.total_iters, spec.end_factor
        return lambda s: b * (ef + (1.0 - ef) * ((n - np.minimum(s, n)) / n) ** spec.power)
    if name == "onecycle":
        return _onecycle(spec, onecycle_phases(spec, b))
    if name == "cosine_restarts":
        return _restarts(spec, b)
    if name == "warmup_cosine":
        return warmup_cosine(spec, b)
    if name == "inverse_sqrt":
        w, tau = spec.warmup_steps, spec.timescale
        warm = _warmup(b, spec.start_factor, w)
        return lambda s: np.where(s < w, warm(s), b * np.sqrt(tau / np.maximum(s - w + tau, 1)))
    if name == "wsd":
        return _wsd(spec, b)
    if name == "sequential":
        parts = [lr_function(p, b) for p in spec.schedulers]
        return _sequential(parts, spec.milestones)
    if name == "chained":
        factors = [lr_function(p, 1.0) for p in spec.schedulers]
        return lambda s: b * np.prod([np.broadcast_to(f(s), s.shape) for f in factors], axis=0)
    if name == "cyclic":
        return lambda s: b + (spec.max_lr - b) * _cyclic_height(spec, s)
    if name == "reduce_on_plateau":
        return lambda s: np.full(s.shape, b)  # between observations the lr holds (plateau_lrs)
    if name == "tabulated":
        table = np.asarray(spec.factors, dtype=np.float64)
        return lambda s: b * table[np.minimum(np.asarray(s, dtype=np.int64), len(table) - 1)]
    raise ValueError(f"unknown schedule {name!r}")


def _sequential(parts: list[Fn], milestones: list[int]) -> Fn:
    starts = np.asarray([0, *milestones])

    def fn(s: np.ndarray) -> np.ndarray:
        index = np.searchsorted(np.asarray(milestones), s, side="right")
        out = np.zeros(s.shape)
        for i, part in enumerate(parts):
            out = np.where(index == i, part(np.maximum(s - starts[i], 0)), out)
        return out

    return fn


def momentum_function(spec: ScheduleSpec) -> Fn:
    """onecycle's / cyclic's cycled momentum (or beta1) as a function of the schedule step s."""
    if spec.name == "cyclic":
        hi, lo = spec.max_momentum, spec.base_momentum
        return lambda s: hi - (hi - lo) * _cyclic_height(spec, s)
    return _onecycle(spec, onecycle_phases(spec, 1.0, momentum=True))


def _better(spec: ScheduleSpec, a: float, best: float) -> bool:
    if spec.mode == "min":
        return a < (best * (1 - spec.threshold) if spec.threshold_mode == "rel" else best - spec.threshold)
    return a > (best * (1 + spec.threshold) if spec.threshold_mode == "rel" else best + spec.threshold)


def plateau_lrs(spec: ScheduleSpec, base: list[float], metrics: np.ndarray | None, steps: int) -> np.ndarray:
    """reduce_on_plateau: (steps, groups) lrs; row t is the lr after observing metrics[0..t-1]."""
    lrs = np.array(base, dtype=np.float64)
    best, bad, cooldown = (np.inf if spec.mode == "min" else -np.inf), 0, 0
    out = np.empty((steps, len(base)))
    for t in range(steps):
        out[t] = lrs
        if metrics is None:
            continue
        m = float(metrics[t])
        if _better(spec, m, best):
            best, bad = m, 0
        else:
            bad += 1
        if cooldown > 0:
            cooldown, bad = cooldown - 1, 0
        if bad > spec.patience:
            new = np.maximum(lrs * spec.factor, np.asarray(spec.min_lr, np.float64))  # one floor or one per group
            lrs = np.where(lrs - new > spec.eps, new, lrs)
            cooldown, bad = spec.cooldown, 0
    return out


def schedule_values(
    schedule: ScheduleSpec, optimizer: Any, steps: int, updates_per_epoch: int = 1, *,
    at: Any = None, metrics: Any = None,
) -> dict[str, Any]:
    """The values updates t = 0..steps-1 apply (or only the updates listed in `at`, strictly
    increasing): {"lr": (rows, groups) array, "momentum": (rows, groups) array or None,
    "momentum_name": "momentum" | "beta1" | None, "hyper": {key: (rows, groups) array, NaN where
    the group does not read the key} for [schedule.hyper]}. Groups are ordered as in
    `conformance.rules.groups.group_base_lrs`: [[optimizer.groups]] in order, the default group last.
    `metrics` (reduce_on_plateau only): the value observed after each update t = 0..steps-1."""
    check_schedule(schedule, optimizer, steps, updates_per_epoch)
    observed = check_metrics(schedule, metrics, steps)
    rows = spots(steps, at)
    base = start_lrs(schedule, group_base_lrs(optimizer))
    s = rows // updates_per_epoch
    if schedule.name == "reduce_on_plateau":
        lr = plateau_lrs(schedule, base, observed, steps)[rows]
        return {"lr": lr, "momentum": None, "momentum_name": None, "hyper": _hyper_table(schedule, optimizer, s)}
    lr = np.stack([np.broadcast_to(lr_function(schedule, b)(s), s.shape) for b in base], axis=1)
    name = cycled_hyperparameter(schedule, optimizer)
    momentum = None
    if name is not None:
        m = momentum_function(schedule)(s)
        momentum = np.stack([m] * len(base), axis=1)
    return {"lr": lr.astype(np.float64), "momentum": momentum, "momentum_name": name,
            "hyper": _hyper_table(schedule, optimizer, s)}


def _hyper_table(schedule: ScheduleSpec, optimizer: Any, s: np.ndarray) -> dict[str, np.ndarray]:
    """[schedule.hyper]'s values at schedule steps `s`, one column per group (NaN: not read)."""
    return {key: np.stack([np.full(s.shape, np.nan) if b is None else
                           np.broadcast_to(lr_function(schedule.hyper[key], b)(s), s.shape)  # type: ignore[index]
                           for b in bases], axis=1).astype(np.float64)
            for key, bases in hyper_bases(schedule, optimizer).items()}
