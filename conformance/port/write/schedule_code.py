"""The `[schedule]` section as code: torch.optim.lr_scheduler objects, or optax schedules.

Both mirror the backends exactly (ref_torch/_schedules.py and ref_jax/_schedules.py): the torch
classes of the same meaning (ChainedScheduler, CyclicLR, ReduceLROnPlateau included), LambdaLR
only where torch has no class, composite schedules flattened into one SequentialLR; on the optax
side optax's schedules where their mathematics is the spec's and small closed forms where it is
not (torch's cosine past t_max, OneCycleLR's fractional phase ends, warm restarts for ever with
Keras's m_mul, an exact staircase, CyclicLR's triangles, a chained product), every one a function
of a float schedule step. reduce_on_plateau follows observed metrics: the torch snippet's Updater
and the optax snippet's `observe` feed them (`plateau_step`, torch's ReduceLROnPlateau.step).
"""

from __future__ import annotations

from conformance.config.schedule import ScheduleSpec
from conformance.port.write.common import lit

Segment = tuple[int | None, str]  # (length or None = open-ended, expression building a scheduler)


# ------------------------------------------------------------------ torch


def _factor(expr: str) -> str:
    # LambdaLR multiplies each group's base lr by a factor: where torch has no class
    return f"lr_scheduler.LambdaLR(optimizer, lambda s: {expr})"


def _restart_factor(s: ScheduleSpec) -> str:
    return _per_group(f"restart_value(s, b, {s.t_0}, {s.t_mult}, {lit(s.m_mul)}, {lit(s.eta_min)})")


def _torch_single(s: ScheduleSpec) -> str:
    name = s.name
    if name in ("step", "exponential") and s.end_factor is not None:
        k, bound = (s.step_size if name == "step" else 1), ("max" if s.gamma < 1 else "min")
        return _factor(f"{bound}({lit(s.gamma)} ** (s // {k}), {lit(s.end_factor)})")
    if name == "linear" and (s.start_factor > 1 or s.end_factor > 1):
        return _factor(f"{lit(s.start_factor)} + ({lit(s.end_factor)} - {lit(s.start_factor)}) * "
                       f"min(s, {s.total_iters}) / {s.total_iters}")
    if name == "polynomial" and s.end_factor:
        return _factor(f"{lit(s.end_factor)} + (1.0 - {lit(s.end_factor)}) * (1.0 - min(s, {s.total_iters}) / "
                       f"{s.total_iters}) ** {lit(s.power)}")
    if name == "cosine_restarts" and s.m_mul != 1:
        return _restart_factor(s)
    if name == "tabulated":  # the table read at the step, its last factor held
        return _factor(f"{lit(list(s.factors))}[min(s, {len(s.factors) - 1})]")
    if name == "chained":
        parts = ",\n        ".join(_torch_single(p) for p in s.schedulers)
        return f"lr_scheduler.ChainedScheduler([\n        {parts},\n    ], optimizer)"
    if name == "cyclic":
        base = lit(s.base_lr) if s.base_lr is not None else "base"
        return (f"lr_scheduler.CyclicLR(\n        optimizer, base_lr={base}, max_lr={lit(s.max_lr)}, "
                f"step_size_up={s.step_size_up}, step_size_down={s.step_size_down},\n        mode={lit(s.mode)}, "
                f"gamma={lit(s.gamma)}, cycle_momentum={s.cycle_momentum}, base_momentum={lit(s.base_momentum)}, "
                f"max_momentum={lit(s.max_momentum)})")
    if name == "reduce_on_plateau":
        return (f"lr_scheduler.ReduceLROnPlateau(\n        optimizer, mode={lit(s.mode)}, factor={lit(s.factor)}, "
                f"patience={s.patience}, threshold={lit(s.threshold)},\n        threshold_mode={lit(s.threshold_mode)}, "
                f"cooldown={s.cooldown}, min_lr={lit(s.min_lr)}, eps={lit(s.eps)})")
    if name == "constant":
        return f"lr_scheduler.ConstantLR(optimizer, factor={lit(s.factor or 1.0)}, total_iters={s.total_iters or 1})"
    if name == "step":
        return f"lr_scheduler.StepLR(optimizer, step_size={s.step_size}, gamma={lit(s.gamma)})"
    if name == "multistep":
        return f"lr_scheduler.MultiStepLR(optimizer, milestones={lit(list(s.milestones))}, gamma={lit(s.gamma)})"
    if name == "exponential":
        return f"lr_scheduler.ExponentialLR(optimizer, gamma={lit(s.gamma)})"
    if name == "cosine":
        return f"lr_scheduler.CosineAnnealingLR(optimizer, T_max={s.t_max}, eta_min={lit(s.eta_min)})"
    if name == "linear":
        return (f"lr_scheduler.LinearLR(optimizer, start_factor={lit(s.start_factor)}, "
                f"end_factor={lit(s.end_factor)}, total_iters={s.total_iters})")
    if name == "polynomial":
        return f"lr_scheduler.PolynomialLR(optimizer, total_iters={s.total_iters}, power={lit(s.power)})"
    if name == "cosine_restarts":
        return (f"lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0={s.t_0}, T_mult={s.t_mult}, "
                f"eta_min={lit(s.eta_min)})")
    if name == "onecycle":
        peak = f"[{lit(s.max_lr)}] * len(base)" if s.max_lr is not None else "base"
        return (f"lr_scheduler.OneCycleLR(\n        optimizer, max_lr={peak}, total_steps={s.total_steps}, "
                f"pct_start={lit(s.pct_start)}, anneal_strategy={lit(s.anneal_strategy)},\n        "
                f"div_factor={lit(s.div_factor)}, final_div_factor={lit(s.final_div_factor)}, "
                f"three_phase={s.three_phase}, cycle_momentum={s.cycle_momentum},\n        "
                f"base_momentum={lit(s.base_momentum)}, max_momentum={lit(s.max_momentum)})")
    raise ValueError(name)


def _warmup(s: ScheduleSpec) -> str:
    if 0 < s.start_factor <= 1:
        return (f"lr_scheduler.LinearLR(optimizer, start_factor={lit(s.start_factor)}, end_factor=1.0, "
                f"total_iters={s.warmup_steps})")
    if s.start_factor == 0:
        return f"lr_scheduler.LambdaLR(optimizer, lambda s: s / {s.warmup_steps})"  # LinearLR cannot start at 0
    sf = lit(s.start_factor)  # from above the peak: LinearLR refuses start_factor > 1
    return _factor(f"{sf} + (1.0 - {sf}) * s / {s.warmup_steps}")


def _per_group(expr: str) -> str:
    # LambdaLR multiplies each group's base lr b: the value divided by b (0 stays 0)
    return f"lr_scheduler.LambdaLR(optimizer, [lambda s, b=b: ({expr}) / b if b > 0 else 0.0 for b in base])"


def _wsd_decay(s: ScheduleSpec) -> str:
    p = f"min(s / {s.decay_steps}, 1.0)"
    shape = {"linear": f"1.0 - {p}", "cosine": f"(1 + math.cos(math.pi * {p})) / 2",
             "1-sqrt": f"1.0 - math.sqrt({p})"}[s.decay_type]
    eta = lit(s.eta_min)
    return _per_group(f"{eta} + (b - {eta}) * ({shape})")


def torch_segments(s: ScheduleSpec) -> list[Segment]:
    """A schedule as consecutive segments, each a scheduler that restarts at its own step 0."""
    warm = (s.warmup_steps or 0, _warmup(s)) if s.name in ("warmup_cosine", "inverse_sqrt", "wsd") else None
    if s.name == "warmup_cosine":
        w, total = s.warmup_steps, s.total_steps
        cos = f"lr_scheduler.CosineAnnealingLR(optimizer, T_max={total - w}, eta_min={lit(s.eta_min)})"
        if s.convention == "torch":
            return [warm, (None, cos)]  # type: ignore[list-item]
        return [warm, (total - w, cos), (None, _per_group(lit(s.eta_min)))]  # type: ignore[list-item]
    if s.name == "inverse_sqrt":
        tau = s.timescale
        return [warm, (None, f"lr_scheduler.LambdaLR(optimizer, lambda s: math.sqrt({tau} / (s + {tau})))")]  # type: ignore[list-item]
    if s.name == "wsd":
        stable = "lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=1)"
        return [warm, (s.total_steps - s.warmup_steps - s.decay_steps, stable), (None, _wsd_decay(s))]  # type: ignore[list-item,operator]
    if s.name == "sequential":
        bounds = [0, *s.milestones]
        out: list[Segment] = []
        for i, part in enumerate(s.schedulers):
            length = bounds[i + 1] - bounds[i] if i + 1 < len(bounds) else None
            out.extend(_truncate(torch_segments(part), length))
        return out
    return [(None, _torch_single(s))]


def _truncate(segments: list[Segment], length: int | None) -> list[Segment]:
    if length is None:
        return segments
    out, left = [], length
    for n, make in segments:
        if left <= 0:
            break
        used = left if n is None else min(n, left)
        out.append((used, make))
        left -= used
    return out


TORCH_HELPERS = {
    "restart_value": '''
def restart_value(s, b, t_0, t_mult, m_mul, eta_min):
    """Warm restarts (exact integer cycles) whose peak above eta_min is multiplied by m_mul at each
    restart (Keras's CosineDecayRestarts; CosineAnnealingWarmRestarts has no m_mul)."""
    i, start, length = (s // t_0, s - s % t_0, t_0) if t_mult == 1 else (0, 0, t_0)
    while s >= start + length:
        start, length, i = start + length, length * t_mult, i + 1
    return eta_min + (b - eta_min) * m_mul ** i * (1 + math.cos(math.pi * (s - start) / length)) / 2
''',
}


def torch_helpers(s: ScheduleSpec) -> str:
    """Helper functions the torch scheduler code calls (module level)."""
    parts = s.schedulers or [] if s.name in ("sequential", "chained") else [s]
    used = any(p.name == "cosine_restarts" and p.m_mul != 1 for p in parts)
    return TORCH_HELPERS["restart_value"].strip("\n") if used else ""


def torch_scheduler_code(s: ScheduleSpec) -> str:
    """The body of `build_scheduler(optimizer)` (returns the scheduler; `base` = each group's lr)."""
    kept = [(n, e) for n, e in torch_segments(s) if n != 0]
    lines = ['base = [group["lr"] for group in optimizer.param_groups]']
    if len(kept) == 1:
        return "\n".join(lines + [f"return {kept[0][1]}"])
    milestones, total = [], 0
    for n, _ in kept[:-1]:
        total += n  # type: ignore[operator]
        milestones.append(total)
    parts = ",\n".join(f"    {e}" for _, e in kept)
    return "\n".join(lines + ["parts = [  # built in order: each constructor sets the groups' lr", parts + ",",
                              "]", f"return lr_scheduler.SequentialLR(optimizer, parts, milestones={milestones})"])


# ------------------------------------------------------------------ optax

OPTAX_HELPERS = {
    "torch_cosine": '''
def torch_cosine(b, eta, t_max):
    """CosineAnnealingLR for every step: past t_max the cosine climbs back (optax's clamps)."""
    unit = optax.cosine_decay_schedule(1.0, t_max)
    def schedule(s):
        u = jnp.mod(s, 2 * t_max)
        return eta + (b - eta) * unit(jnp.minimum(u, 2 * t_max - u))
    return schedule
''',
    "restarts": '''
def restarts(b, t_0, t_mult, eta, m_mul=1.0):
    """CosineAnnealingWarmRestarts: restarts for ever (optax.sgdr_schedule stops after its list);
    each restart's peak above eta multiplied by m_mul (Keras's CosineDecayRestarts)."""
    starts, lengths = [0], [t_0]
    while t_mult > 1 and starts[-1] <= 2**53:
        starts.append(starts[-1] + lengths[-1])
        lengths.append(lengths[-1] * t_mult)
    def schedule(s):
        if t_mult == 1:
            i, t_cur, t_i = s // t_0, jnp.mod(s, t_0), t_0
        else:
            i = jnp.searchsorted(jnp.asarray(starts, s.dtype), s, side="right") - 1
            t_cur, t_i = s - jnp.asarray(starts, s.dtype)[i], jnp.asarray(lengths, s.dtype)[i]
        return eta + (b - eta) * m_mul ** i * (1 + jnp.cos(jnp.pi * t_cur / t_i)) / 2
    return schedule
''',
    "cyclic": '''
def cyclic(b, top, up, down, mode, gamma):
    """CyclicLR's triangles: b -> top over `up` updates, back over `down` (triangular2: the
    amplitude halves every cycle; exp_range: times gamma ** s). Called with b = top = 0 and 1 it
    is the fraction of the amplitude (momentum cycles against it)."""
    total = float(up + down)
    def schedule(s):
        cycle = 1 + s // total  # exact: floor(s / total) is not under XLA
        x = 1.0 + s / total - cycle
        h = jnp.where(x <= up / total, x / (up / total), (x - 1) / (up / total - 1))
        scale = {"triangular": 1.0, "triangular2": 1 / (2.0 ** (cycle - 1)), "exp_range": gamma ** s}[mode]
        return b + (top - b) * h * scale
    return schedule
''',
    "onecycle": '''
def onecycle(kind, phases):
    """OneCycleLR's phases [(end_step, start, end), ...], ends at torch's float steps pct*T - 1, ..."""
    parts, bounds, begin = [], [], 0.0
    for end, a, z in phases:
        if kind == "linear":
            parts.append(optax.linear_schedule(a, z, end - begin))
        else:
            unit = optax.cosine_decay_schedule(1.0, end - begin)
            parts.append(lambda s, a=a, z=z, unit=unit: z + (a - z) * unit(s))
        bounds.append(end)
        begin = end
    return optax.join_schedules(parts, bounds[:-1])
''',
}


def _phases(s: ScheduleSpec, peak: str, momentum: bool = False) -> str:
    total, pct = s.total_steps, s.pct_start
    first, second, last = float(pct * total) - 1, float(2 * pct * total) - 2, total - 1
    hi, lo = lit(s.max_momentum), lit(s.base_momentum)
    init, low = f"{peak} / {lit(s.div_factor)}", f"{peak} / {lit(s.div_factor)} / {lit(s.final_div_factor)}"
    if s.three_phase:
        rows = ([(first, hi, lo), (second, lo, hi), (last, hi, hi)] if momentum else
                [(first, init, peak), (second, peak, init), (last, init, low)])
    else:
        rows = [(first, hi, lo), (last, lo, hi)] if momentum else [(first, init, peak), (last, peak, low)]
    return "[" + ", ".join(f"({lit(float(e))}, {a}, {z})" for e, a, z in rows) + "]"


def optax_schedule(s: ScheduleSpec, used: set[str], b: str = "b") -> str:
    """An expression for the schedule of a group with base lr `b` (a function of the float step)."""
    name = s.name
    warm = f"optax.linear_schedule({b} * {lit(s.start_factor)}, {b}, {s.warmup_steps})"
    if name == "constant":
        if s.factor is None:
            return f"optax.constant_schedule({b})"
        return f"optax.piecewise_constant_schedule({b} * {lit(s.factor)}, {{{s.total_iters}: 1.0 / {lit(s.factor)}}})"
    if name == "step":  # optax's staircase lands early at some boundaries under a float64 count
        value = f"{b} * {lit(s.gamma)} ** (s // {s.step_size})"
        if s.end_factor is not None:
            value = f"jnp.{'maximum' if s.gamma < 1 else 'minimum'}({value}, {b} * {lit(s.end_factor)})"
        return f"lambda s: {value}"
    if name == "multistep":
        return f"optax.piecewise_constant_schedule({b}, {{m: {lit(s.gamma)} for m in {list(s.milestones)}}})"
    if name == "exponential":
        end = "" if s.end_factor is None else f", end_value={b} * {lit(s.end_factor)}"
        return f"optax.exponential_decay({b}, 1, {lit(s.gamma)}{end})"
    if name == "cosine":
        used.add("torch_cosine")
        return f"torch_cosine({b}, {lit(s.eta_min)}, {s.t_max})"
    if name == "linear":
        return (f"optax.linear_schedule({b} * {lit(s.start_factor)}, {b} * {lit(s.end_factor)}, "
                f"{s.total_iters})")
    if name == "polynomial":
        end = f"{b} * {lit(s.end_factor)}" if s.end_factor else "0.0"
        return f"optax.polynomial_schedule({b}, {end}, {lit(s.power)}, {s.total_iters})"
    if name == "onecycle":
        used.add("onecycle")
        peak = lit(s.max_lr) if s.max_lr is not None else b
        return f"onecycle({lit(s.anneal_strategy)}, {_phases(s, peak)})"
    if name == "cosine_restarts":
        used.add("restarts")
        return f"restarts({b}, {s.t_0}, {s.t_mult}, {lit(s.eta_min)}, {lit(s.m_mul)})"
    if name == "warmup_cosine":
        w, total, eta = s.warmup_steps, s.total_steps, lit(s.eta_min)
        if s.convention == "optax":
            return f"optax.warmup_cosine_decay_schedule({b} * {lit(s.start_factor)}, {b}, {w}, {total}, {eta})"
        used.add("torch_cosine")
        return f"optax.join_schedules([{warm}, torch_cosine({b}, {eta}, {total - w})], [{w}])"
    if name == "inverse_sqrt":
        tau = s.timescale
        return (f"optax.join_schedules([{warm}, lambda u: {b} * jnp.sqrt({tau} / jnp.maximum(u + {tau}, 1.0))], "
                f"[{s.warmup_steps}])")
    if name == "wsd":
        return _optax_wsd(s, b, warm)
    if name == "sequential":
        parts = ", ".join(optax_schedule(p, used, b) for p in s.schedulers)
        return f"optax.join_schedules([{parts}], {list(s.milestones)})"
    if name == "chained":  # ChainedScheduler: the product of every part's factor
        factors = " * ".join(f"({optax_schedule(p, used, '1.0')})(s)" for p in s.schedulers)
        return f"lambda s: {b} * {factors}"
    if name == "cyclic":
        used.add("cyclic")
        base = lit(s.base_lr) if s.base_lr is not None else b
        return (f"cyclic({base}, {lit(s.max_lr)}, {s.step_size_up}, {s.step_size_down}, {lit(s.mode)}, "
                f"{lit(s.gamma)})")
    if name == "tabulated":  # one gather at the step, clipped to the table: its last factor held
        return (f"lambda s, t=jnp.asarray({lit(list(s.factors))}): {b} * "
                f"t[jnp.clip(jnp.asarray(s), 0, {len(s.factors) - 1}).astype(jnp.int32)]")
    if name == "reduce_on_plateau":
        return f"optax.constant_schedule({b})"  # between observations the lr holds; observe() moves it
    raise ValueError(name)


def _optax_wsd(s: ScheduleSpec, b: str, warm: str) -> str:
    d, eta = s.decay_steps, lit(s.eta_min)
    if s.decay_type == "linear":
        decay = f"optax.linear_schedule({b}, {eta}, {d})"
    elif s.decay_type == "cosine":
        decay = f"lambda u: {eta} + ({b} - {eta}) * optax.cosine_decay_schedule(1.0, {d})(u)"
    else:
        decay = f"lambda u: {eta} + ({b} - {eta}) * (1.0 - jnp.sqrt(jnp.clip(u / {d}, 0.0, 1.0)))"
    return (f"optax.join_schedules([{warm}, optax.constant_schedule({b}), {decay}], "
            f"[{s.warmup_steps}, {s.total_steps - d}])")  # type: ignore[operator]


def momentum_schedule(s: ScheduleSpec, used: set[str]) -> str:
    """onecycle's / cyclic's cycled momentum (or beta1) as an expression."""
    if s.name == "cyclic":  # against the lr: max_momentum − (max − base)·(the lr's fraction of its amplitude)
        used.add("cyclic")
        hi, lo = lit(s.max_momentum), lit(s.base_momentum)
        height = f"cyclic(0.0, 1.0, {s.step_size_up}, {s.step_size_down}, {lit(s.mode)}, {lit(s.gamma)})"
        return f"lambda s, h={height}: {hi} - ({hi} - {lo}) * h(s)"
    used.add("onecycle")
    return f"onecycle({lit(s.anneal_strategy)}, {_phases(s, '1.0', momentum=True)})"


def helpers(used: set[str]) -> str:
    """The helper functions the schedule expressions call."""
    return "\n\n".join(OPTAX_HELPERS[k].strip("\n") for k in ("torch_cosine", "restarts", "cyclic", "onecycle")
                       if k in used)
