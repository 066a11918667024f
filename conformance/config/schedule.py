"""`[schedule]`: the learning rate as a function of the update count t (docs/contract.md §2).

    [schedule]
    name = "warmup_cosine"    # see SCHEDULE_NAMES
    warmup_steps = 100
    total_steps = 1000
    eta_min = 1e-5

Counting: update t = 0, 1, 2, ... counts optimizer updates; the value at t is the lr that update t
applies (torch: `scheduler.step()` after `optimizer.step()`; optax: `schedule(count)` before the
count advances). With `unit = "epoch"` every length below is in epochs and the value at update t
is the schedule at s = t // updates_per_epoch.

Field names and defaults are torch's (lr_scheduler constructor arguments in snake_case). Options
that torch has no default for, or that only some schedules read, are None until a schedule that
reads them fills in its default: the resolved config (dump_config) states every value in force.
`eta_min` is absolute, as in torch's CosineAnnealingLR: every group anneals from its own base lr to
the same eta_min. `docs/divergences.md#schedules` lists where torch and optax differ.

Parameter groups: `conformance.rules.groups.group_base_lrs` gives the base lr of each group in the
order used everywhere an lr list appears (metrics, cases, checkpoints): the `[[optimizer.groups]]`
in file order, then the default group (parameters no pattern matches) last.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from conformance.config.base import (
    FloatIn,
    NonNegative,
    NonNegInt,
    PosInt,
    Positive,
    Section,
    UnitClosed,
    UnitHalfOpen,
    field_error,
)

ScheduleName = Literal[
    "constant", "step", "multistep", "exponential", "cosine", "linear", "polynomial", "onecycle",
    "cosine_restarts", "warmup_cosine", "inverse_sqrt", "wsd", "sequential",
]
SCHEDULE_NAMES: tuple[str, ...] = ScheduleName.__args__  # type: ignore[attr-defined]

WARMUP = ("warmup_cosine", "inverse_sqrt", "wsd")

# Which schedule reads which option; setting an option another schedule would ignore is an error.
USED_BY: dict[str, tuple[str, ...]] = {
    "step_size": ("step",),
    "gamma": ("step", "multistep", "exponential"),
    "milestones": ("multistep", "sequential"),
    "factor": ("constant",),
    "start_factor": ("linear", *WARMUP),
    "end_factor": ("linear",),
    "total_iters": ("constant", "linear", "polynomial"),
    "power": ("polynomial",),
    "t_max": ("cosine",),
    "eta_min": ("cosine", "cosine_restarts", "warmup_cosine", "wsd"),
    "t_0": ("cosine_restarts",), "t_mult": ("cosine_restarts",),
    **{k: ("onecycle",) for k in ("max_lr", "pct_start", "anneal_strategy", "div_factor", "final_div_factor",
                                 "three_phase", "cycle_momentum", "base_momentum", "max_momentum")},
    "total_steps": ("onecycle", "warmup_cosine", "wsd"),
    "warmup_steps": WARMUP,
    "convention": ("warmup_cosine",),
    "timescale": ("inverse_sqrt",),
    "decay_steps": ("wsd",), "decay_type": ("wsd",),
    "schedulers": ("sequential",),
}

# torch's defaults (OneCycleLR, LinearLR, ...) and twinstep's for the schedules torch lacks.
DEFAULTS: dict[str, dict[str, Any]] = {
    "step": {"gamma": 0.1},
    "multistep": {"gamma": 0.1},
    "cosine": {"eta_min": 0.0},
    "linear": {"start_factor": 1.0 / 3, "end_factor": 1.0, "total_iters": 5},
    "polynomial": {"total_iters": 5, "power": 1.0},
    "onecycle": {"pct_start": 0.3, "anneal_strategy": "cos", "div_factor": 25.0,
                 "final_div_factor": 1e4, "three_phase": False, "cycle_momentum": True,
                 "base_momentum": 0.85, "max_momentum": 0.95},
    "cosine_restarts": {"t_mult": 1, "eta_min": 0.0},
    "warmup_cosine": {"start_factor": 0.0, "eta_min": 0.0, "convention": "optax"},
    "inverse_sqrt": {"start_factor": 0.0},
    "wsd": {"warmup_steps": 0, "start_factor": 0.0, "eta_min": 0.0, "decay_type": "linear"},
    "sequential": {"milestones": []},
}

REQUIRED: dict[str, tuple[str, ...]] = {
    "step": ("step_size",),
    "multistep": ("milestones",),
    "exponential": ("gamma",),
    "cosine": ("t_max",),
    "onecycle": ("total_steps",),
    "cosine_restarts": ("t_0",),
    "warmup_cosine": ("warmup_steps", "total_steps"),
    "inverse_sqrt": ("warmup_steps",),
    "wsd": ("total_steps", "decay_steps"),
    "sequential": ("schedulers",),
}

MIN_START_FACTOR = 1e-100  # LinearLR's first ratio (1 - sf) / (total_iters·sf) must stay finite

# Optimizers whose torch class cycles `momentum` or `betas[0]` under OneCycleLR(cycle_momentum).
MOMENTUM_OPTIMIZERS = ("sgd", "rmsprop")
BETA1_OPTIMIZERS = ("adam", "adamw", "adamax", "nadam", "radam", "lion")


class ScheduleSpec(Section):
    """A learning-rate schedule (value at update t = lr applied by update t).

    constant (no options: the base lr; with `factor` [, `total_iters` = 5]: torch's ConstantLR),
    step (StepLR: step_size, gamma), multistep (MultiStepLR: milestones, gamma), exponential
    (ExponentialLR: gamma), cosine (CosineAnnealingLR: t_max, eta_min; past t_max it follows
    torch's cosine back up), linear (LinearLR), polynomial (PolynomialLR), onecycle (OneCycleLR,
    with momentum/beta1 cycling), cosine_restarts (CosineAnnealingWarmRestarts: t_0, t_mult,
    eta_min), warmup_cosine, inverse_sqrt, wsd (see conformance/oracle/schedules.py for their
    closed forms), sequential (SequentialLR: [[schedule.schedulers]] and milestones).

    warmup_cosine: update 0 applies lr·start_factor, update `warmup_steps` is the first to apply
    the peak lr, update `total_steps` (warm-up included) the first to apply eta_min. `convention`
    "optax" is optax.warmup_cosine_decay_schedule (eta_min held after total_steps), "torch" is
    SequentialLR([LinearLR(start_factor, 1, warmup_steps), CosineAnnealingLR(total_steps -
    warmup_steps, eta_min)], [warmup_steps]) (the cosine climbs back after total_steps)."""

    name: ScheduleName = "constant"
    unit: Literal["update", "epoch"] = "update"
    step_size: PosInt | None = None
    gamma: Positive | None = None
    milestones: list[PosInt] | None = None
    factor: FloatIn(0.0, 1.0, lo_open=True) | None = None
    start_factor: UnitClosed | None = None
    end_factor: UnitClosed | None = None
    total_iters: PosInt | None = None
    power: NonNegative | None = None
    t_max: PosInt | None = None
    eta_min: NonNegative | None = None
    t_0: PosInt | None = None
    t_mult: PosInt | None = None
    max_lr: Positive | None = None
    total_steps: PosInt | None = None
    pct_start: FloatIn(0.0, 1.0, lo_open=True, hi_open=True) | None = None
    anneal_strategy: Literal["cos", "linear"] | None = None
    div_factor: Positive | None = None
    final_div_factor: Positive | None = None
    three_phase: bool | None = None
    cycle_momentum: bool | None = None
    base_momentum: UnitHalfOpen | None = None
    max_momentum: UnitHalfOpen | None = None
    warmup_steps: NonNegInt | None = None
    convention: Literal["optax", "torch"] | None = None
    timescale: PosInt | None = None
    decay_steps: PosInt | None = None
    decay_type: Literal["linear", "cosine", "1-sqrt"] | None = None
    schedulers: list["ScheduleSpec"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        # Per-schedule defaults are filled here so that dump_config writes the values in force.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        name = data.get("name", "constant")
        if not isinstance(name, str):
            return data
        for key, value in DEFAULTS.get(name, {}).items():
            data.setdefault(key, value)
        if name == "constant" and "factor" in data:
            data.setdefault("total_iters", 5)  # torch's ConstantLR default
        warmup = data.get("warmup_steps")
        if name == "inverse_sqrt" and isinstance(warmup, int) and warmup > 0:
            data.setdefault("timescale", warmup)
        parts = data.get("schedulers")
        if isinstance(parts, list):
            # the parts of a sequential schedule share its unit
            unit = data.get("unit", "update")
            data["schedulers"] = [
                {**p, "unit": p.get("unit", unit)} if isinstance(p, dict) else p for p in parts
            ]
        return data

    @model_validator(mode="after")
    def _check(self) -> "ScheduleSpec":
        self.reject_unused(USED_BY, "name")
        for key in REQUIRED.get(self.name, ()):
            if getattr(self, key) is None:
                raise field_error(key, f"is required for name = {self.name!r}")
        if self.name == "constant" and self.total_iters is not None and self.factor is None:
            raise field_error("total_iters", "needs factor (torch's ConstantLR multiplies the lr "
                                             "by factor for total_iters updates)")
        if self.milestones is not None:
            _check_increasing(self.milestones)
        if self.start_factor is not None and 0 < self.start_factor < MIN_START_FACTOR:
            raise field_error("start_factor", f"must be 0 or >= {MIN_START_FACTOR:g}: torch's recursive LinearLR "
                                              f"divides by start_factor and overflows; received {self.start_factor!r}")
        if self.name == "linear" and self.start_factor == 0:
            raise field_error("start_factor", "must be in (0, 1] for linear (torch's LinearLR cannot "
                                              "start at 0; warmup_cosine and wsd can); received 0")
        check = _CHECKS.get(self.name)
        if check is not None:
            check(self)
        return self

    @property
    def length(self) -> int | None:
        """The schedule's own length in its unit (where it reaches its end value), if it has one."""
        if self.name in ("onecycle", "warmup_cosine", "wsd"):
            return self.total_steps
        if self.name == "cosine":
            return self.t_max
        if self.name in ("linear", "polynomial") or (self.name == "constant" and self.factor):
            return self.total_iters
        if self.name == "sequential" and self.schedulers:
            last = self.schedulers[-1].length
            return None if last is None else (self.milestones[-1] if self.milestones else 0) + last
        return None


def _check_increasing(milestones: list[int]) -> None:
    for i in range(1, len(milestones)):
        if milestones[i] <= milestones[i - 1]:
            raise field_error(
                f"milestones[{i}]",
                f"must be greater than milestones[{i - 1}] = {milestones[i - 1]} (milestones are "
                f"strictly increasing update counts); received {milestones[i]}",
            )


def _check_multistep(s: ScheduleSpec) -> None:
    if not s.milestones:
        raise field_error("milestones", "must list at least one update count for multistep")


def _check_onecycle(s: ScheduleSpec) -> None:
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


def _check_warmup_cosine(s: ScheduleSpec) -> None:
    if s.warmup_steps >= s.total_steps:  # type: ignore[operator]
        raise field_error(
            "warmup_steps",
            f"must be less than total_steps = {s.total_steps} (the warm-up would outlast the "
            f"schedule); received {s.warmup_steps}",
        )


def _check_inverse_sqrt(s: ScheduleSpec) -> None:
    if s.timescale is None:
        raise field_error("timescale", "is required when warmup_steps = 0 (the decay is "
                                       "sqrt(timescale / (t - warmup_steps + timescale)))")


def _check_wsd(s: ScheduleSpec) -> None:
    warmup, decay, total = s.warmup_steps, s.decay_steps, s.total_steps
    if warmup >= total:  # type: ignore[operator]
        raise field_error("warmup_steps", f"must be less than total_steps = {total} (the warm-up "
                                          f"would outlast the schedule); received {warmup}")
    if warmup + decay > total:  # type: ignore[operator]
        raise field_error("decay_steps", f"plus warmup_steps ({warmup}) must be <= total_steps = "
                                         f"{total}; received {decay}")


def _check_sequential(s: ScheduleSpec) -> None:
    parts, milestones = s.schedulers or [], s.milestones or []
    if not parts:
        raise field_error("schedulers", "must list at least one [[schedule.schedulers]] table")
    for i, part in enumerate(parts):
        if part.name in ("sequential", "onecycle"):
            why = ("torch's SequentialLR cannot restart a nested SequentialLR at a milestone"
                   if part.name == "sequential" else
                   "torch's OneCycleLR overwrites every group's initial lr, which the other parts use")
            raise field_error(f"schedulers[{i}].name", f"cannot be {part.name!r} inside sequential: {why}")
        if part.unit != s.unit:
            raise field_error(f"schedulers[{i}].unit", f"must equal the sequential schedule's unit "
                                                       f"{s.unit!r}; received {part.unit!r}")
    if len(milestones) != len(parts) - 1:
        raise field_error("milestones", f"must have one entry fewer than schedulers ({len(parts)} "
                                        f"parts need {len(parts) - 1}); received {len(milestones)}")


_CHECKS = {
    "multistep": _check_multistep,
    "onecycle": _check_onecycle,
    "warmup_cosine": _check_warmup_cosine,
    "inverse_sqrt": _check_inverse_sqrt,
    "wsd": _check_wsd,
    "sequential": _check_sequential,
}
