"""Schedule rules that need more than the [schedule] table: the optimizer, the run length, the groups.

Shared by ref_torch, ref_jax and the oracle (each builds its schedules from these facts):

- `start_lrs`: the lr each group's schedule starts from (onecycle's `max_lr` and cyclic's
  `base_lr` override the groups);
- `cycled_hyperparameter`: what onecycle's / cyclic's momentum cycling drives (momentum or beta1);
- `hyper_bases` / `hyper_value` / `hyper_field`: the groups' values a `[schedule.hyper.<key>]`
  schedule starts from, and the param-group entry it writes (beta1 / beta2: betas[0] / betas[1]);
- `onecycle_phases`: torch's OneCycleLR phase boundaries and end values;
- `check_schedule` / `check_run_length`: cross-section refusals (ConfigError / InputError) and notes;
- `spots` / `check_metrics`: the inputs of `schedule_values(..., at=, metrics=)`;
- reduce_on_plateau in training: `check_observed` (evaluations to observe), `plateau_to_json` /
  `plateau_from_json` (its neutral checkpoint state, conformance/rules/plateau.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from conformance.config.schedule import (
    BETA1_OPTIMIZERS,
    CYCLED,
    MOMENTUM_OPTIMIZERS,
    PLATEAU,
    WARMUP,
    ScheduleSpec,
)
from conformance.errors import ConfigError, InputError
from conformance.rules.groups import group_base_lrs, group_layout

# Optimizers that refuse a scheduled hyper-parameter, and why.
_HYPER_REFUSED = {
    "schedule_free_sgd": "its averaging assumes fixed hyper-parameters; the schedulefree package schedules none",
    "schedule_free_adamw": "its averaging assumes fixed hyper-parameters; the schedulefree package schedules none",
    "prodigy": "its d estimate sums over updates with fixed betas (prodigyopt's beta3 follows beta2); only its lr "
               "takes a schedule",
}


def start_lrs(schedule: ScheduleSpec, base_lrs: list[float]) -> list[float]:
    """The lr each group's schedule is built from: its base lr, onecycle's `max_lr` when set
    (torch's OneCycleLR(max_lr=float) gives every group the same peak), or cyclic's `base_lr` when
    set (torch's CyclicLR writes base_lr into every group at construction)."""
    if schedule.name == "onecycle" and schedule.max_lr is not None:
        return [float(schedule.max_lr)] * len(base_lrs)
    if schedule.name == "cyclic" and schedule.base_lr is not None:
        return [float(schedule.base_lr)] * len(base_lrs)
    return [float(b) for b in base_lrs]


def cycled_hyperparameter(schedule: ScheduleSpec, optimizer: Any) -> str | None:
    """What onecycle's / cyclic's momentum cycling drives: "momentum" (SGD, RMSprop), "beta1"
    (Adam-like, Lion: betas[0]) or None (no cycling)."""
    if schedule.name not in CYCLED or not schedule.cycle_momentum:
        return None
    name = getattr(optimizer, "name", "")
    if name == "muon":
        raise ConfigError("schedule.cycle_momentum = true is not supported with optimizer.name = 'muon' "
                          "(its fallback optimizer cycles beta1, Muon its momentum); set it to false")
    if name == "ademamix":
        raise ConfigError("schedule.cycle_momentum = true is not supported with optimizer.name = 'ademamix' "
                          "(its beta1 also starts the beta3 warm-up; no peer cycles it); set it to false")
    if name == "prodigy":
        raise ConfigError("schedule.cycle_momentum = true is not supported with optimizer.name = 'prodigy' "
                          "(its d estimate assumes fixed betas; no peer cycles them); set it to false")
    if name in MOMENTUM_OPTIMIZERS:
        return "momentum"
    if name in BETA1_OPTIMIZERS:
        return "beta1"
    raise ConfigError(
        f"schedule.cycle_momentum = true needs an optimizer with momentum or betas; optimizer.name = "
        f"{name!r} has neither (set schedule.cycle_momentum = false)"
    )


def hyper_value(key: str, hp: Any) -> float | None:
    """Hyper-parameter `key` (beta1 / beta2: betas[0] / betas[1]) of a group's hyper-parameters `hp`
    (a mapping, e.g. torch's param_group), None where the group has none."""
    if key in ("beta1", "beta2"):
        betas = hp.get("betas")
        return None if betas is None else betas[0 if key == "beta1" else 1]
    return hp.get(key)


def hyper_bases(schedule: ScheduleSpec, optimizer: Any) -> dict[str, list[float | None]]:
    """For each `[schedule.hyper.<key>]`: the value every parameter group starts from, in the order
    of conformance.rules.groups.group_base_lrs, None where the group's optimizer does not read it
    (muon's momentum is not its fallback's). Empty without schedule.hyper."""
    layout = group_layout(optimizer)
    return {key: [None if (v := hyper_value(key, g.hyperparams)) is None else float(v) for g in layout]
            for key in (schedule.hyper or {})}


def hyper_field(key: str, hp: Any, value: Any) -> tuple[str, Any]:
    """The param-group entry that sets hyper-parameter `key` to `value` in the group whose
    hyper-parameters are `hp` (torch's param_group, or any mapping): ("betas", (value, hp's beta2))
    for beta1, ("betas", (beta1, value)) for beta2, else (key, value)."""
    if key == "beta1":
        return "betas", (value, hp["betas"][1])
    if key == "beta2":
        return "betas", (hp["betas"][0], value)
    return key, value


def _peak_factor(spec: ScheduleSpec) -> float:
    """An upper bound of the schedule's factor over every update (inf where none is stated)."""
    if spec.name == "tabulated":
        return max(spec.factors or [1.0])
    if spec.name == "sequential":
        return max(_peak_factor(p) for p in spec.schedulers or [])
    if spec.name == "chained":
        return float(np.prod([_peak_factor(p) for p in spec.schedulers or []]))
    if spec.name in ("step", "multistep", "exponential") and spec.gamma > 1:  # type: ignore[operator]
        return float("inf") if spec.end_factor is None else spec.end_factor
    return max([1.0, *(v for v in (spec.start_factor, spec.end_factor) if v is not None)])


# The largest value each scheduled key may reach (the static field's range), and why.
_HYPER_CEILING = {
    "beta1": (1.0, False, "it must stay below 1"), "beta2": (1.0, False, "it must stay below 1"),
    "beta3": (1.0, False, "it must stay below 1"),
    "dampening": (1.0, True, "it must stay at most 1 (the field's range [0, 1])"),
}


def _check_hyper(schedule: ScheduleSpec, optimizer: Any, last: int) -> None:
    if "eps" in (schedule.hyper or {}) and "adafactor" in optimizer.group_optimizers():
        raise ConfigError("schedule.hyper.eps is not supported with adafactor (its eps is torch's pair [eps1, eps2], "
                          "not one number a schedule can scale); remove it")
    cycled = cycled_hyperparameter(schedule, optimizer)
    for key, bases in hyper_bases(schedule, optimizer).items():
        where, part = f"schedule.hyper.{key}", schedule.hyper[key]  # type: ignore[index]
        for name in optimizer.group_optimizers():
            if name in _HYPER_REFUSED:
                raise ConfigError(f"{where} is not supported with optimizer.name = {name!r}: {_HYPER_REFUSED[name]}")
        if key == "beta1" and "ademamix" in optimizer.group_optimizers():
            raise ConfigError(f"{where} is not supported with ademamix (its beta1 also starts the beta3 warm-up; "
                              "no peer schedules it)")
        read = [b for b in bases if b is not None]
        if not read:
            field = "betas" if key in ("beta1", "beta2") else key
            raise ConfigError(f"{where}: no parameter group's optimizer reads {field} (optimizer.name = "
                              f"{optimizer.name!r}); remove it")
        if cycled is not None and cycled == key:
            raise ConfigError(f"{where} and schedule.cycle_momentum both set {key}; set schedule.cycle_momentum = "
                              "false or remove the hyper schedule")
        peak = max(read) * _peak_factor(part)
        ceiling = _HYPER_CEILING.get(key)
        if key == "alpha" and "rmsprop" in optimizer.group_optimizers():  # AdEMAMix's alpha has no ceiling
            ceiling = (1.0, True, "rmsprop's smoothing constant must stay at most 1")
        if ceiling is not None and not (peak <= ceiling[0] if ceiling[1] else peak < ceiling[0]):
            raise ConfigError(f"{where} can reach {key} = {peak:g} (the largest group value {max(read):g} times "
                              f"the schedule's largest factor); {ceiling[2]}")
        _check_chained_length(part, last)
        _check_floor(part, min(read), where, key)


def check_schedule(schedule: ScheduleSpec, optimizer: Any, steps: int, updates_per_epoch: int = 1) -> None:
    """Checks that need the optimizer or the run length; raise ConfigError / InputError (one line)."""
    for name, value in (("steps", steps), ("updates_per_epoch", updates_per_epoch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be an integer >= 1; received {value!r}")
    if schedule.unit == "update" and updates_per_epoch != 1:
        raise InputError(f"updates_per_epoch = {updates_per_epoch} is only read with schedule.unit = "
                         f"'epoch'; received it with unit = 'update'")
    base = group_base_lrs(optimizer)
    for key, name in (("max_lr", "onecycle"), ("base_lr", "cyclic")):
        if schedule.name == name and getattr(schedule, key) is not None:
            own = [i for i, g in enumerate(optimizer.groups) if getattr(g, "lr", None) is not None]
            if own:
                raise ConfigError(f"schedule.{key} sets every group's lr, but optimizer.groups[{own[0]}].lr sets "
                                  f"its own; remove schedule.{key} so that each group keeps its own lr")
    if schedule.name in CYCLED:
        cycled_hyperparameter(schedule, optimizer)
    if schedule.name == "reduce_on_plateau" and isinstance(schedule.min_lr, list) and len(schedule.min_lr) != len(base):
        raise ConfigError(f"schedule.min_lr lists {len(schedule.min_lr)} floors for {len(base)} parameter groups; give "
                          "one per group in group order (the [[optimizer.groups]] parts in file order, the default "
                          "group last) or a single number")
    last = (steps - 1) // updates_per_epoch  # the last schedule step the run reaches
    _check_chained_length(schedule, last)
    _check_onecycle_length(schedule, last)
    _check_floor(schedule, min(base))
    _check_hyper(schedule, optimizer, last)


def _check_onecycle_length(schedule: ScheduleSpec, last: int) -> None:
    if schedule.name == "onecycle" and last >= schedule.total_steps:  # type: ignore[operator]
        raise ConfigError(f"schedule.total_steps = {schedule.total_steps} is shorter than the run ({last + 1} "
                          f"{schedule.unit}s); torch's OneCycleLR raises past total_steps")


def _check_floor(schedule: ScheduleSpec, low: float, outer: str = "schedule", what: str = "lr") -> None:
    # A floor above a group's lr turns a decay into a climb: refused for every group, whichever framework runs it
    parts = schedule.schedulers if schedule.name == "sequential" else [schedule]
    for part in parts or []:
        where = outer if part is schedule else f"a {outer}.schedulers part"
        if part.name in ("warmup_cosine", "wsd") and part.eta_min > low:  # type: ignore[operator]
            raise ConfigError(
                f"{where} eta_min = {part.eta_min} exceeds the lowest group {what} {low}; {part.name} "
                f"decays every group from its own {what} down to eta_min, so eta_min must not exceed any"
            )
        if part.name in ("cosine", "cosine_restarts") and part.eta_min is not None and part.eta_min > low:
            raise ConfigError(f"{where} eta_min = {part.eta_min} is above the lowest group {what} {low}: {part.name} "
                              f"would anneal the {what} up to eta_min; eta_min must not exceed any group's {what}")


def _check_chained_length(schedule: ScheduleSpec, last: int) -> None:
    # torch's CosineAnnealingLR is a factor of the current lr only up to t_max (then it adds base-lr terms)
    for i, part in enumerate(schedule.schedulers or [] if schedule.name == "chained" else []):
        if part.name == "cosine" and last > part.t_max:  # type: ignore[operator]
            raise ConfigError(f"schedule.schedulers[{i}] (cosine, t_max = {part.t_max}) inside chained reaches "
                              f"{schedule.unit} {last}, past t_max: torch's chained CosineAnnealingLR stops being "
                              f"a factor there; raise t_max to at least {last}")


def spots(steps: int, at: Sequence[int] | None) -> np.ndarray:
    """The updates whose values are asked for: `at` (strictly increasing, each in [0, steps)) or all."""
    if at is None:
        return np.arange(steps, dtype=np.int64)
    out = np.asarray(list(at), dtype=np.int64)
    if out.ndim != 1 or out.size == 0:
        raise InputError(f"at must list at least one update; received {list(at)!r}")
    bad = np.flatnonzero(np.diff(out) <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise InputError(f"at[{i}] = {out[i]} must be greater than at[{i - 1}] = {out[i - 1]} (strictly increasing)")
    if out[0] < 0 or out[-1] >= steps:
        raise InputError(f"at must lie in [0, steps = {steps}); received {int(out[0] if out[0] < 0 else out[-1])}")
    return out


def check_metrics(schedule: ScheduleSpec, metrics: Sequence[float] | None, steps: int) -> np.ndarray | None:
    """The metric observed after each update t = 0..steps-1 as float64 (reduce_on_plateau only)."""
    if metrics is None:
        return None
    if schedule.name not in PLATEAU:
        raise InputError(f"metrics are observed only by schedule.name = 'reduce_on_plateau'; received "
                         f"{len(metrics)} values for name = {schedule.name!r}")
    values = np.asarray(list(metrics), dtype=np.float64)
    if values.shape != (steps,):
        raise InputError(f"metrics must hold one value per update ({steps}: the value observed after "
                         f"update t); received {values.size}")
    return values


def check_observed(schedule: ScheduleSpec, eval_every: int, n_val: int, loss_name: str) -> None:
    """A training run with reduce_on_plateau must evaluate what it monitors (ConfigError naming both fields)."""
    if schedule.name not in PLATEAU:
        return
    if eval_every == 0:
        raise ConfigError("schedule.name = 'reduce_on_plateau' observes the validation metric at each evaluation, "
                          "but run.eval_every = 0 never evaluates; set run.eval_every")
    if n_val == 0:
        raise ConfigError("schedule.name = 'reduce_on_plateau' observes the validation metric, but data.val_fraction "
                          "leaves no validation samples")
    if schedule.monitor == "val_accuracy" and loss_name not in ("cross_entropy", "nll"):
        raise ConfigError(f"schedule.monitor = 'val_accuracy' needs a classification loss; loss.name = "
                          f"{loss_name!r} has no accuracy (monitor 'val_loss')")


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
    _check_onecycle_length(schedule, last)
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
