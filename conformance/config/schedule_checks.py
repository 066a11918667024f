"""The per-schedule checks of `[schedule]` (conformance/config/schedule.py): ranges that depend on
the schedule's name, options that mean nothing together, and the parts a composite may hold.

Each check raises `field_error(field, message)`, so the one-line ConfigError names the field:
`schedule.mode must be one of 'triangular', 'triangular2', 'exp_range'; received 'tri'`.
"""

from __future__ import annotations

from typing import Any

from conformance.config.base import field_error

WARMUP = ("warmup_cosine", "inverse_sqrt", "wsd")
CYCLIC_MODES = ("triangular", "triangular2", "exp_range")
PLATEAU_MODES = ("min", "max")
MIN_START_FACTOR = 1e-100  # LinearLR's first ratio (1 - sf) / (total_iters·sf) must stay finite

# Why a schedule cannot be a part of sequential / chained (torch's reason).
NOT_SEQUENTIAL = {
    "sequential": "torch's SequentialLR cannot restart a nested SequentialLR at a milestone",
    "chained": "torch's SequentialLR restarts a later part from its closed form (_update_lr(0)), which "
               "ChainedScheduler has not (NotImplementedError at the milestone); a chained first part is allowed",
    "onecycle": "torch's OneCycleLR overwrites every group's initial lr, which the other parts use",
    "cyclic": "torch's CyclicLR overwrites every group's lr (base_lr) and momentum at construction",
    "reduce_on_plateau": "it steps on an observed metric, which SequentialLR does not pass",
}
# ChainedScheduler multiplies the factors of "chainable" schedulers: those whose torch class updates
# the current lr multiplicatively (StepLR, MultiStepLR, ExponentialLR, ConstantLR, LinearLR,
# PolynomialLR, CosineAnnealingLR without eta_min). The others set the lr from the base lr.
CHAINABLE = ("constant", "step", "multistep", "exponential", "cosine", "linear", "polynomial")
# A chained *first* part of sequential: SequentialLR's construction steps the chained parts once more
# outside their initial step, which ExponentialLR, PolynomialLR and CosineAnnealingLR count as a step
# (they start one step ahead: γ^(t+1)); these four check last_epoch == 0 and run as in a ChainedScheduler.
FIRST_IN_SEQUENTIAL = ("constant", "step", "multistep", "linear")
NOT_CHAINABLE = {
    "onecycle": "OneCycleLR sets the lr from its phases, not as a factor of the current lr",
    "cyclic": "CyclicLR sets the lr from base_lr and max_lr, not as a factor of the current lr",
    "cosine_restarts": "CosineAnnealingWarmRestarts sets the lr from the base lr in closed form",
    "reduce_on_plateau": "torch's ChainedScheduler refuses ReduceLROnPlateau (its step needs a metric)",
    "chained": "a nested chained schedule multiplies the same factors: list its parts directly",
    **{n: "torch builds it from LambdaLR / SequentialLR, which set the lr from the base lr"
       for n in (*WARMUP, "sequential", "tabulated")},
}


def _modes(s: Any, allowed: tuple[str, ...]) -> None:
    if s.mode not in allowed:
        raise field_error("mode", f"must be one of {', '.join(repr(m) for m in allowed)}; received {s.mode!r}")


def check_increasing(milestones: list[int]) -> None:
    for i in range(1, len(milestones)):
        if milestones[i] <= milestones[i - 1]:
            raise field_error(
                f"milestones[{i}]",
                f"must be greater than milestones[{i - 1}] = {milestones[i - 1]} (milestones are "
                f"strictly increasing update counts); received {milestones[i]}",
            )


def _check_factors(s: Any) -> None:
    if s.start_factor is not None and 0 < s.start_factor < MIN_START_FACTOR:
        raise field_error("start_factor", f"must be 0 or >= {MIN_START_FACTOR:g}: torch's recursive LinearLR "
                                          f"divides by start_factor and overflows; received {s.start_factor!r}")
    if s.name == "linear" and s.start_factor == 0:
        raise field_error("start_factor", "must be > 0 for linear (torch's LinearLR cannot start at 0; "
                                          "warmup_cosine and wsd can); received 0")
    if s.name in ("exponential", "step") and s.end_factor is not None:
        g, ef = s.gamma, s.end_factor
        if g == 1:
            raise field_error("end_factor", f"means nothing with gamma = 1 (the lr never moves towards it); "
                                            f"received {ef!r}")
        if (g < 1 and ef > 1) or (g > 1 and ef < 1):
            side = "a floor <= 1 for gamma < 1" if g < 1 else "a ceiling >= 1 for gamma > 1"
            raise field_error("end_factor", f"must be {side} = {g!r} (optax's end_value bounds the decay); "
                                            f"received {ef!r}")


def _check_multistep(s: Any) -> None:
    if not s.milestones:
        raise field_error("milestones", "must list at least one update count for multistep")


def _check_onecycle(s: Any) -> None:
    total, pct = int(s.total_steps or 0), float(s.pct_start or 0.0)
    # torch's phase ends are floats: pct*T - 1 (peak), [2*pct*T - 2], T - 1 (end)
    if float(pct * total) - 1 <= 0:
        raise field_error(
            "pct_start",
            f"times total_steps must be > 1 so that the warm-up ends after update 0 (torch divides by "
            f"pct_start * total_steps - 1); received {pct} * {total} = {pct * total:g}",
        )
    if s.three_phase and float(2 * pct * total) - 2 >= total - 1:
        raise field_error(
            "pct_start",
            f"is too large for three_phase: the second phase would end at update "
            f"{2 * pct * total - 2:g}, not before the last update {total - 1}; received {pct}",
        )


def _check_warmup_cosine(s: Any) -> None:
    if s.warmup_steps >= s.total_steps:
        raise field_error(
            "warmup_steps",
            f"must be less than total_steps = {s.total_steps} (the warm-up would outlast the "
            f"schedule); received {s.warmup_steps}",
        )


def _check_inverse_sqrt(s: Any) -> None:
    if s.timescale is None:
        raise field_error("timescale", "is required when warmup_steps = 0 (the decay is "
                                       "sqrt(timescale / (t - warmup_steps + timescale)))")


def _check_wsd(s: Any) -> None:
    warmup, decay, total = s.warmup_steps, s.decay_steps, s.total_steps
    if warmup >= total:
        raise field_error("warmup_steps", f"must be less than total_steps = {total} (the warm-up "
                                          f"would outlast the schedule); received {warmup}")
    if warmup + decay > total:
        raise field_error("decay_steps", f"plus warmup_steps ({warmup}) must be <= total_steps = "
                                         f"{total}; received {decay}")


def _parts(s: Any, refused: dict[str, str]) -> list[Any]:
    parts = s.schedulers or []
    if not parts:
        raise field_error("schedulers", "must list at least one [[schedule.schedulers]] table")
    for i, part in enumerate(parts):
        if i == 0 and s.name == "sequential" and part.name == "chained":
            _check_chained_first(part)
        elif part.name in refused:
            raise field_error(f"schedulers[{i}].name", f"cannot be {part.name!r} inside {s.name}: "
                                                       f"{refused[part.name]}")
        if part.hyper:
            raise field_error(f"schedulers[{i}].hyper", "must be set on the outer schedule (the parts of a "
                                                        f"{s.name} schedule the lr only)")
        if part.unit != s.unit:
            raise field_error(f"schedulers[{i}].unit", f"must equal the {s.name} schedule's unit "
                                                       f"{s.unit!r}; received {part.unit!r}")
    return parts


def _check_chained_first(part: Any) -> None:
    for j, sub in enumerate(part.schedulers or []):
        if sub.name not in FIRST_IN_SEQUENTIAL:
            raise field_error(f"schedulers[0].schedulers[{j}].name", f"cannot be {sub.name!r} in a chained first part "
                              "of sequential: torch's SequentialLR steps it once more when it is built, so it runs "
                              "a step ahead (ExponentialLR: gamma^(t+1)); use only constant, step, multistep and "
                              "linear there, or the chained schedule on its own (docs/divergences.md S-SEQ-CHAINED)")


def _check_sequential(s: Any) -> None:
    parts, milestones = _parts(s, NOT_SEQUENTIAL), s.milestones or []
    if len(milestones) != len(parts) - 1:
        raise field_error("milestones", f"must have one entry fewer than schedulers ({len(parts)} "
                                        f"parts need {len(parts) - 1}); received {len(milestones)}")


def _not_multiplicative(p: Any) -> tuple[str, str, Any] | None:
    """(field, what it must be, value) where a chainable schedule's torch form is not a factor."""
    if p.name == "cosine" and p.eta_min:
        return "eta_min", "be 0 (torch's CosineAnnealingLR anneals lr − eta_min: not a factor)", p.eta_min
    if p.name == "linear" and (p.start_factor > 1 or p.end_factor > 1):
        field = "start_factor" if p.start_factor > 1 else "end_factor"
        return field, "be <= 1 (beyond 1 torch needs LambdaLR, which sets the lr)", getattr(p, field)
    if p.name in ("exponential", "step") and p.end_factor is not None:
        return "end_factor", "be unset (a bound needs LambdaLR, which sets the lr)", p.end_factor
    if p.name == "polynomial" and p.end_factor:
        return "end_factor", "be 0 (torch's PolynomialLR; another end needs LambdaLR)", p.end_factor
    return None


def _check_chained(s: Any) -> None:
    for i, part in enumerate(_parts(s, NOT_CHAINABLE)):
        found = _not_multiplicative(part)
        if found is not None:
            field, need, value = found
            raise field_error(f"schedulers[{i}].{field}", f"must {need} inside chained, whose parts "
                                                          f"multiply; received {value!r}")


def _check_cyclic(s: Any) -> None:
    _modes(s, CYCLIC_MODES)
    forced = "iterations" if s.mode == "exp_range" else "cycle"
    if s.scale_mode != forced:
        raise field_error("scale_mode", f"= {s.scale_mode!r} means nothing with mode = {s.mode!r}: torch's "
                                        f"CyclicLR uses scale_mode {forced!r} for it (scale_mode is read only "
                                        f"with a custom scale_fn)")
    if s.mode != "exp_range" and s.gamma != 1:
        raise field_error("gamma", f"= {s.gamma!r} means nothing with mode = {s.mode!r}: only exp_range "
                                   f"reads gamma")


def _check_plateau(s: Any) -> None:
    _modes(s, PLATEAU_MODES)
    if s.factor >= 1:
        raise field_error("factor", f"must be < 1 (torch's ReduceLROnPlateau refuses a factor that does "
                                    f"not reduce); received {s.factor!r}")
    if s.unit != "update":
        raise field_error("unit", f"= {s.unit!r} means nothing with name = 'reduce_on_plateau': it steps "
                                  f"when a metric is observed, not per update or epoch")


def _check_tabulated(s: Any) -> None:
    if not s.factors:
        raise field_error("factors", "must hold at least one factor (the lr of update t is the base lr times "
                                     "factors[t], the last one held); received []")


_CHECKS = {
    "tabulated": _check_tabulated,
    "multistep": _check_multistep,
    "onecycle": _check_onecycle,
    "warmup_cosine": _check_warmup_cosine,
    "inverse_sqrt": _check_inverse_sqrt,
    "wsd": _check_wsd,
    "sequential": _check_sequential,
    "chained": _check_chained,
    "cyclic": _check_cyclic,
    "reduce_on_plateau": _check_plateau,
}


# Why a schedule cannot drive a hyper-parameter ([schedule.hyper.<key>]).
NOT_HYPER = {
    "reduce_on_plateau": "it steps on an observed metric; only the lr follows one",
    "onecycle": "it cycles the lr between its own absolute values (use [schedule] onecycle with cycle_momentum)",
    "cyclic": "it cycles the lr between its own absolute values (use [schedule] cyclic with cycle_momentum)",
}


def _check_hyper(s: Any) -> None:
    for key, part in (s.hyper or {}).items():
        if part.name in NOT_HYPER:
            raise field_error(f"hyper.{key}.name", f"cannot be {part.name!r}: {NOT_HYPER[part.name]}")
        if part.unit != s.unit:
            raise field_error(f"hyper.{key}.unit", f"must equal the schedule's unit {s.unit!r} (the lr and "
                                                   f"the hyper-parameters count alike); received {part.unit!r}")
        if part.hyper:
            raise field_error(f"hyper.{key}.hyper", "cannot be nested: each [schedule.hyper.<key>] schedules one "
                                                    "hyper-parameter")


def check_spec(s: Any) -> None:
    """Every check of one ScheduleSpec (its parts were checked when they were built)."""
    _check_hyper(s)
    if s.name == "constant" and s.total_iters is not None and s.factor is None:
        raise field_error("total_iters", "needs factor (torch's ConstantLR multiplies the lr "
                                         "by factor for total_iters updates)")
    if s.milestones is not None:
        check_increasing(s.milestones)
    _check_factors(s)
    check = _CHECKS.get(s.name)
    if check is not None:
        check(s)
