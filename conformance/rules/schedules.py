"""Schedule rules that need more than the [schedule] table: the optimizer, the run length, the groups.

Shared by ref_torch, ref_jax and the oracle (each builds its schedules from these facts):

- `start_lrs`: the lr each group's schedule starts from (onecycle's `max_lr` overrides the groups);
- `cycled_hyperparameter`: what onecycle's momentum cycling drives (momentum or beta1);
- `onecycle_phases`: torch's OneCycleLR phase boundaries and end values;
- `check_schedule` / `check_run_length`: cross-section refusals (ConfigError / InputError) and notes.
"""

from __future__ import annotations

from typing import Any

from conformance.config.schedule import (
    BETA1_OPTIMIZERS,
    MOMENTUM_OPTIMIZERS,
    WARMUP,
    ScheduleSpec,
)
from conformance.errors import ConfigError, InputError
from conformance.rules.groups import group_base_lrs


def start_lrs(schedule: ScheduleSpec, base_lrs: list[float]) -> list[float]:
    """The lr each group's schedule is built from: its base lr, or onecycle's `max_lr` when set
    (torch's OneCycleLR(max_lr=float) gives every group the same peak)."""
    if schedule.name == "onecycle" and schedule.max_lr is not None:
        return [float(schedule.max_lr)] * len(base_lrs)
    return [float(b) for b in base_lrs]


def cycled_hyperparameter(schedule: ScheduleSpec, optimizer: Any) -> str | None:
    """What onecycle's momentum cycling drives: "momentum" (SGD, RMSprop, Muon), "beta1" (Adam-like,
    Lion: betas[0]) or None (no cycling)."""
    if schedule.name != "onecycle" or not schedule.cycle_momentum:
        return None
    name = getattr(optimizer, "name", "")
    if name == "muon":
        raise ConfigError("schedule.cycle_momentum = true is not supported with optimizer.name = 'muon' "
                          "(its fallback optimizer cycles beta1, Muon its momentum); set it to false")
    if name in MOMENTUM_OPTIMIZERS:
        return "momentum"
    if name in BETA1_OPTIMIZERS:
        return "beta1"
    raise ConfigError(
        f"schedule.cycle_momentum = true needs an optimizer with momentum or betas; optimizer.name = "
        f"{name!r} has neither (set schedule.cycle_momentum = false)"
    )


def check_schedule(schedule: ScheduleSpec, optimizer: Any, steps: int, updates_per_epoch: int = 1) -> None:
    """Checks that need the optimizer or the run length; raise ConfigError / InputError (one line)."""
    for name, value in (("steps", steps), ("updates_per_epoch", updates_per_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be an integer >= 1; received {value!r}")
    if schedule.unit == "update" and updates_per_epoch != 1:
        raise InputError(f"updates_per_epoch = {updates_per_epoch} is only read with schedule.unit = "
                         f"'epoch'; received it with unit = 'update'")
    base = group_base_lrs(optimizer)
    if schedule.name == "onecycle":
        if schedule.max_lr is not None and any(getattr(g, "lr", None) is not None for g in optimizer.groups):
            raise ConfigError("schedule.max_lr sets one peak for every group, but optimizer.groups set "
                              "their own lr; remove max_lr so that each group peaks at its own lr")
        last = (steps - 1) // updates_per_epoch
        if last >= schedule.total_steps:  # type: ignore[operator]
            raise ConfigError(
                f"schedule.total_steps = {schedule.total_steps} is shorter than the run ({last + 1} "
                f"{schedule.unit}s); torch's OneCycleLR raises past total_steps"
            )
        cycled_hyperparameter(schedule, optimizer)
    for part in _floored(schedule):
        low = min(base)
        if part.eta_min > low:  # type: ignore[operator]
            where = "schedule" if part is schedule else "a schedule.schedulers part"
            raise ConfigError(
                f"{where} eta_min = {part.eta_min} exceeds the lowest group lr {low}; {part.name} "
                f"decays every group from its own lr down to eta_min, so eta_min must not exceed any"
            )


def _floored(schedule: ScheduleSpec) -> list[ScheduleSpec]:
    # warmup_cosine and wsd hold eta_min as a fraction of each group's lr after their decay
    parts = schedule.schedulers if schedule.name == "sequential" else [schedule]
    return [p for p in parts or [] if p.name in ("warmup_cosine", "wsd")]


def check_run_length(schedule: ScheduleSpec, n_updates: int, updates_per_epoch: int = 1) -> list[str]:
    """Compare the schedule with a run of `n_updates`: raise ConfigError where the run cannot work
    (warm-up that never ends; onecycle shorter than the run), return notes on likely mistakes."""
    last = (n_updates - 1) // updates_per_epoch  # the last schedule step the run reaches
    unit = schedule.unit + "s"
    if schedule.name in WARMUP and schedule.warmup_steps and schedule.warmup_steps > last:
        raise ConfigError(
            f"schedule.warmup_steps = {schedule.warmup_steps} is longer than the run ({last + 1} "
            f"{unit}): the lr would never reach its peak"
        )
    if schedule.name == "onecycle" and last >= schedule.total_steps:  # type: ignore[operator]
        raise ConfigError(f"schedule.total_steps = {schedule.total_steps} is shorter than the run "
                          f"({last + 1} {unit}); torch's OneCycleLR raises past total_steps")
    notes = []
    length = schedule.length
    if length is not None and length > last + 1:
        notes.append(f"the schedule runs for {length} {unit} but the run has {last + 1}: it stops "
                     f"before reaching its end value")
    if schedule.name == "cosine" and last > length:  # type: ignore[operator]
        notes.append(f"the run continues past t_max = {length}: torch's CosineAnnealingLR climbs back "
                     f"towards the base lr there (use warmup_cosine to hold eta_min)")
    return notes


def onecycle_phases(spec: ScheduleSpec, peak: float, momentum: bool = False) -> list[tuple[float, float, float]]:
    """torch's OneCycleLR phases as (end_step, start_value, end_value), for the lr or the momentum."""
    total, pct = spec.total_steps, spec.pct_start
    initial = peak / spec.div_factor
    low = initial / spec.final_div_factor
    hi_m, lo_m = spec.max_momentum, spec.base_momentum
    first, second = float(pct * total) - 1, float(2 * pct * total) - 2
    if spec.three_phase:
        if momentum:
            return [(first, hi_m, lo_m), (second, lo_m, hi_m), (total - 1, hi_m, hi_m)]
        return [(first, initial, peak), (second, peak, initial), (total - 1, initial, low)]
    if momentum:
        return [(first, hi_m, lo_m), (total - 1, lo_m, hi_m)]
    return [(first, initial, peak), (total - 1, peak, low)]
