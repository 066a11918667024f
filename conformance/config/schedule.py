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
    UnitHalfOpen,
    field_error,
)
from conformance.config.schedule_checks import (
    CYCLIC_MODES,
    MIN_START_FACTOR,
    PLATEAU_MODES,
    WARMUP,
    check_spec,
)

__all__ = [  # the check constants live in schedule_checks.py; importable from here as before
    "BETA1_OPTIMIZERS", "COMPOSITE", "CYCLED", "CYCLIC_MODES", "DEFAULTS", "HYPER_KEYS", "HyperKey", "MIN_START_FACTOR",
    "MOMENTUM_OPTIMIZERS", "MONITORS", "PLATEAU", "PLATEAU_MODES", "REQUIRED", "SCHEDULE_NAMES", "ScheduleName",
    "ScheduleSpec", "USED_BY", "WARMUP",
]

ScheduleName = Literal[
    "constant", "step", "multistep", "exponential", "cosine", "linear", "polynomial", "onecycle",
    "cosine_restarts", "warmup_cosine", "inverse_sqrt", "wsd", "sequential", "chained", "cyclic",
    "reduce_on_plateau", "tabulated",
]
SCHEDULE_NAMES: tuple[str, ...] = ScheduleName.__args__  # type: ignore[attr-defined]

# Hyper-parameters other than the lr that [schedule.hyper.<key>] may schedule (beta1 / beta2 are
# betas[0] / betas[1]); each is a float the optimizer reads afresh at every update.
HyperKey = Literal["momentum", "beta1", "beta2", "weight_decay", "eps", "dampening", "alpha", "beta3"]
HYPER_KEYS: tuple[str, ...] = HyperKey.__args__  # type: ignore[attr-defined]

COMPOSITE = ("sequential", "chained")  # schedules made of [[schedule.schedulers]] parts
CYCLED = ("onecycle", "cyclic")  # schedules that may cycle momentum / beta1
PLATEAU = ("reduce_on_plateau",)
MONITORS = ("val_loss", "val_accuracy")

# Which schedule reads which option; setting an option another schedule would ignore is an error.
USED_BY: dict[str, tuple[str, ...]] = {
    "step_size": ("step",),
    "gamma": ("step", "multistep", "exponential", "cyclic"),
    "milestones": ("multistep", "sequential"),
    "factor": ("constant", "reduce_on_plateau"),
    "start_factor": ("linear", *WARMUP),
    "end_factor": ("linear", "polynomial", "exponential", "step"),
    "total_iters": ("constant", "linear", "polynomial"),
    "power": ("polynomial",),
    "t_max": ("cosine",),
    "eta_min": ("cosine", "cosine_restarts", "warmup_cosine", "wsd"),
    "t_0": ("cosine_restarts",), "t_mult": ("cosine_restarts",), "m_mul": ("cosine_restarts",),
    "max_lr": CYCLED,
    **{k: ("onecycle",) for k in ("pct_start", "anneal_strategy", "div_factor", "final_div_factor", "three_phase")},
    **{k: CYCLED for k in ("cycle_momentum", "base_momentum", "max_momentum")},
    **{k: ("cyclic",) for k in ("base_lr", "step_size_up", "step_size_down", "scale_mode")},
    "mode": ("cyclic", *PLATEAU),
    **{k: PLATEAU for k in ("patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps", "monitor")},
    "total_steps": ("onecycle", "warmup_cosine", "wsd"),
    "warmup_steps": WARMUP,
    "convention": ("warmup_cosine",),
    "timescale": ("inverse_sqrt",),
    "decay_steps": ("wsd",), "decay_type": ("wsd",),
    "schedulers": COMPOSITE,
    "factors": ("tabulated",),
}

# torch's defaults (OneCycleLR, LinearLR, CyclicLR, ReduceLROnPlateau, ...), Keras's m_mul, and
# twinstep's for the schedules torch lacks.
DEFAULTS: dict[str, dict[str, Any]] = {
    "step": {"gamma": 0.1},
    "multistep": {"gamma": 0.1},
    "cosine": {"eta_min": 0.0},
    "linear": {"start_factor": 1.0 / 3, "end_factor": 1.0, "total_iters": 5},
    "polynomial": {"total_iters": 5, "power": 1.0, "end_factor": 0.0},
    "onecycle": {"pct_start": 0.3, "anneal_strategy": "cos", "div_factor": 25.0,
                 "final_div_factor": 1e4, "three_phase": False, "cycle_momentum": True,
                 "base_momentum": 0.85, "max_momentum": 0.95},
    "cosine_restarts": {"t_mult": 1, "eta_min": 0.0, "m_mul": 1.0},
    "warmup_cosine": {"start_factor": 0.0, "eta_min": 0.0, "convention": "optax"},
    "inverse_sqrt": {"start_factor": 0.0},
    "wsd": {"warmup_steps": 0, "start_factor": 0.0, "eta_min": 0.0, "decay_type": "linear"},
    "sequential": {"milestones": []},
    "cyclic": {"step_size_up": 2000, "mode": "triangular", "gamma": 1.0, "cycle_momentum": True,
               "base_momentum": 0.8, "max_momentum": 0.9},
    "reduce_on_plateau": {"mode": "min", "factor": 0.1, "patience": 10, "threshold": 1e-4,
                          "threshold_mode": "rel", "cooldown": 0, "min_lr": 0.0, "eps": 1e-8,
                          "monitor": "val_loss"},
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
    "chained": ("schedulers",),
    "cyclic": ("max_lr",),
    "tabulated": ("factors",),
}

# Optimizers whose torch class cycles `momentum` or `betas[0]` under OneCycleLR / CyclicLR(cycle_momentum).
MOMENTUM_OPTIMIZERS = ("sgd", "rmsprop")
BETA1_OPTIMIZERS = ("adam", "adamw", "adamax", "nadam", "radam", "lion")


class ScheduleSpec(Section):
    """A learning-rate schedule (value at update t = lr applied by update t).

    constant (no options: the base lr; with `factor` [, `total_iters` = 5]: torch's ConstantLR),
    step (StepLR: step_size, gamma), multistep (MultiStepLR: milestones, gamma), exponential
    (ExponentialLR: gamma), cosine (CosineAnnealingLR: t_max, eta_min; past t_max it follows
    torch's cosine back up), linear (LinearLR), polynomial (PolynomialLR), onecycle (OneCycleLR,
    with momentum/beta1 cycling), cosine_restarts (CosineAnnealingWarmRestarts: t_0, t_mult,
    eta_min; Keras's CosineDecayRestarts m_mul), warmup_cosine, inverse_sqrt, wsd (see
    conformance/oracle/schedules.py for their closed forms), sequential (SequentialLR:
    [[schedule.schedulers]] and milestones), chained (ChainedScheduler: [[schedule.schedulers]]
    stepped together, their factors multiply), cyclic (CyclicLR), reduce_on_plateau
    (ReduceLROnPlateau: steps on an observed metric, not on the update count).

    warmup_cosine: update 0 applies lr·start_factor, update `warmup_steps` is the first to apply
    the peak lr, update `total_steps` (warm-up included) the first to apply eta_min. `convention`
    "optax" is optax.warmup_cosine_decay_schedule (eta_min held after total_steps), "torch" is
    SequentialLR([LinearLR(start_factor, 1, warmup_steps), CosineAnnealingLR(total_steps -
    warmup_steps, eta_min)], [warmup_steps]) (the cosine climbs back after total_steps).

    optax's forms: `start_factor` > 1 (linear and the warm-ups) starts above the peak, as
    optax.linear_schedule(init_value > end_value) may; `end_factor` is where polynomial ends
    (optax.polynomial_schedule(end_value = lr·end_factor); torch's PolynomialLR is 0) and the
    bound exponential / step decay towards and then hold (optax.exponential_decay(end_value): a
    floor for gamma < 1, a ceiling for gamma > 1).

    cyclic: torch's CyclicLR. `base_lr` overrides every group's lr (as CyclicLR sets each group's
    lr to base_lr at construction; unset = each group's own lr), the lr cycles between it and
    `max_lr` over step_size_up + step_size_down updates; `mode` triangular | triangular2 (the
    amplitude halves every cycle) | exp_range (amplitude × gamma^t); `scale_mode` is the one
    torch's built-in modes force (cycle for the triangular modes, iterations for exp_range).
    With `cycle_momentum` the momentum (or beta1) cycles inversely between max_momentum and
    base_momentum.

    reduce_on_plateau: torch's ReduceLROnPlateau (mode, factor, patience, threshold,
    threshold_mode, cooldown, min_lr, eps); `min_lr` is one floor for every group or a list of
    one per parameter group in group order (torch's min_lr list). In training it observes `monitor` (val_loss or
    val_accuracy) at every evaluation; in schedule cases `[inputs] metrics` gives the value
    observed after each update. Its state (best, num_bad_epochs, cooldown_counter, every group's
    lr) is checkpointed.

    tabulated: the lr of update t (schedule step s) is each group's base lr times `factors[s]`,
    the last factor held past the table (torch: LambdaLR with a lambda that reads the table). It
    states any schedule exactly for as many steps as the table holds: `twinstep port` writes a
    LambdaLR it cannot read in closed form as one, sampled for a stated number of updates.

    hyper: schedules of other hyper-parameters, `[schedule.hyper.<key>]` with key momentum, beta1
    (betas[0]), beta2 (betas[1]), weight_decay, eps, dampening (sgd), alpha (rmsprop's smoothing
    constant, AdEMAMix's mix; each optimizer's own) or beta3 (AdEMAMix), each a schedule of this kind (not
    reduce_on_plateau, onecycle or cyclic) applied to every group whose optimizer reads the key,
    from that group's own value as the lr schedule is from its lr, at the same position (counted in
    optimizer updates, held with the lr on skipped updates). Muon's momentum warm-up 0.85 → 0.95
    over 300 updates is momentum = 0.95 with {name = "linear", start_factor = 0.85 / 0.95,
    total_iters = 300}; weight decay that follows the lr is the lr's schedule repeated here."""

    name: ScheduleName = "constant"
    unit: Literal["update", "epoch"] = "update"
    step_size: PosInt | None = None
    gamma: Positive | None = None
    milestones: list[PosInt] | None = None
    factor: FloatIn(0.0, 1.0, lo_open=True) | None = None
    start_factor: NonNegative | None = None
    end_factor: NonNegative | None = None
    total_iters: PosInt | None = None
    power: NonNegative | None = None
    t_max: PosInt | None = None
    eta_min: NonNegative | None = None
    t_0: PosInt | None = None
    t_mult: PosInt | None = None
    m_mul: Positive | None = None
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
    base_lr: NonNegative | None = None
    step_size_up: PosInt | None = None
    step_size_down: PosInt | None = None
    mode: str | None = None
    scale_mode: Literal["cycle", "iterations"] | None = None
    patience: NonNegInt | None = None
    threshold: NonNegative | None = None
    threshold_mode: Literal["rel", "abs"] | None = None
    cooldown: NonNegInt | None = None
    min_lr: NonNegative | list[NonNegative] | None = None  # one floor, or one per param group
    eps: NonNegative | None = None
    monitor: Literal["val_loss", "val_accuracy"] | None = None
    warmup_steps: NonNegInt | None = None
    convention: Literal["optax", "torch"] | None = None
    timescale: PosInt | None = None
    decay_steps: PosInt | None = None
    decay_type: Literal["linear", "cosine", "1-sqrt"] | None = None
    schedulers: list["ScheduleSpec"] | None = None
    factors: list[NonNegative] | None = None
    hyper: dict[HyperKey, "ScheduleSpec"] | None = None

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
        if name == "cyclic":
            data.setdefault("step_size_down", data.get("step_size_up"))  # torch: None = step_size_up
            # torch's built-in modes force their scale_mode (CyclicLR._init_scale_fn)
            data.setdefault("scale_mode", "iterations" if data.get("mode") == "exp_range" else "cycle")
        parts, hyper, unit = data.get("schedulers"), data.get("hyper"), data.get("unit", "update")
        if isinstance(parts, list):
            # the parts of a composite schedule share its unit, and so do the hyper-parameters' schedules
            data["schedulers"] = [
                {**p, "unit": p.get("unit", unit)} if isinstance(p, dict) else p for p in parts
            ]
        if isinstance(hyper, dict):
            data["hyper"] = {k: {**p, "unit": p.get("unit", unit)} if isinstance(p, dict) else p
                             for k, p in hyper.items()}
        return data

    @model_validator(mode="after")
    def _check(self) -> "ScheduleSpec":
        self.reject_unused(USED_BY, "name")
        for key in REQUIRED.get(self.name, ()):
            if getattr(self, key) is None:
                raise field_error(key, f"is required for name = {self.name!r}")
        check_spec(self)
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
        if self.name == "tabulated" and self.factors:
            return len(self.factors) - 1  # the last factor, held from there on
        if self.name == "chained" and self.schedulers:
            lengths = [p.length for p in self.schedulers]
            return None if None in lengths else max(lengths)  # type: ignore[type-var]
        return None
