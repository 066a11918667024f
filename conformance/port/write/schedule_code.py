"""The `[schedule]` section as code: torch.optim.lr_scheduler objects, or optax schedules.

Both mirror the backends exactly (ref_torch/_schedules.py and ref_jax/_schedules.py): the torch
classes of the same meaning, LambdaLR only where torch has no class, composite schedules flattened
into one SequentialLR; on the optax side optax's schedules where their mathematics is the spec's
and small closed forms where it is not (torch's cosine past t_max, OneCycleLR's fractional phase
ends, warm restarts for ever), every one a function of a float schedule step.
"""

from __future__ import annotations

from conformance.config.schedule import ScheduleSpec
from conformance.port.write.common import lit

Segment = tuple[int | None, str]  # (length or None = open-ended, expression building a scheduler)


# ------------------------------------------------------------------ torch


def _torch_single(s: ScheduleSpec) -> str:
    name = s.name
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
    if s.start_factor > 0:
        return (f"lr_scheduler.LinearLR(optimizer, start_factor={lit(s.start_factor)}, end_factor=1.0, "
                f"total_iters={s.warmup_steps})")
    return f"lr_scheduler.LambdaLR(optimizer, lambda s: s / {s.warmup_steps})"  # LinearLR cannot start at 0


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
def restarts(b, t_0, t_mult, eta):
    """CosineAnnealingWarmRestarts: restarts for ever (optax.sgdr_schedule stops after its list)."""
    starts, lengths = [0], [t_0]
    while t_mult > 1 and starts[-1] <= 2**53:
        starts.append(starts[-1] + lengths[-1])
        lengths.append(lengths[-1] * t_mult)
    def schedule(s):
        if t_mult == 1:
            t_cur, t_i = jnp.mod(s, t_0), t_0
        else:
            i = jnp.searchsorted(jnp.asarray(starts, s.dtype), s, side="right") - 1
            t_cur, t_i = s - jnp.asarray(starts, s.dtype)[i], jnp.asarray(lengths, s.dtype)[i]
        return eta + (b - eta) * (1 + jnp.cos(jnp.pi * t_cur / t_i)) / 2
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
    if name == "step":
        return f"optax.exponential_decay({b}, {s.step_size}, {lit(s.gamma)}, staircase=True)"
    if name == "multistep":
        return f"optax.piecewise_constant_schedule({b}, {{m: {lit(s.gamma)} for m in {list(s.milestones)}}})"
    if name == "exponential":
        return f"optax.exponential_decay({b}, 1, {lit(s.gamma)})"
    if name == "cosine":
        used.add("torch_cosine")
        return f"torch_cosine({b}, {lit(s.eta_min)}, {s.t_max})"
    if name == "linear":
        return (f"optax.linear_schedule({b} * {lit(s.start_factor)}, {b} * {lit(s.end_factor)}, "
                f"{s.total_iters})")
    if name == "polynomial":
        return f"optax.polynomial_schedule({b}, 0.0, {lit(s.power)}, {s.total_iters})"
    if name == "onecycle":
        used.add("onecycle")
        peak = lit(s.max_lr) if s.max_lr is not None else b
        return f"onecycle({lit(s.anneal_strategy)}, {_phases(s, peak)})"
    if name == "cosine_restarts":
        used.add("restarts")
        return f"restarts({b}, {s.t_0}, {s.t_mult}, {lit(s.eta_min)})"
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
    """onecycle's cycled momentum (or beta1) as an expression."""
    used.add("onecycle")
    return f"onecycle({lit(s.anneal_strategy)}, {_phases(s, '1.0', momentum=True)})"


def helpers(used: set[str]) -> str:
    """The helper functions the schedule expressions call."""
    return "\n\n".join(OPTAX_HELPERS[k].strip("\n") for k in ("torch_cosine", "restarts", "onecycle") if k in used)
