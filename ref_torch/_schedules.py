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

# torch.optim.lr_scheduler objects. LambdaLR appears only where torch has no class: inverse_sqrt's
# decay, wsd's decay, a warm-up that starts at 0 or above the peak (LinearLR needs 0 < start_factor
# <= 1), warmup_cosine's hold at eta_min after total_steps, optax's end values and Keras's restart
# multiplier. `unit = "epoch"` wraps the scheduler in `PerEpochLR`, which steps it once every
# `updates_per_epoch` updates. reduce_on_plateau is `MetricPlateau`: stepped after every update
# like the others (a no-op), and with the observed metric by whoever observes it
# (`MetricPlateau.step(metric)`).

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.optim import Optimizer
from torch.optim import lr_scheduler as sched

from conformance.config.schedule import ScheduleSpec
from conformance.errors import ConfigError, InputError
from conformance.rules.plateau import Plateau
from conformance.rules.schedules import hyper_field, hyper_value, start_lrs

_STEP_ORDER = re.escape("Detected call of `lr_scheduler.step()`")  # torch's warning for a step before optimizer.step()
# Keys a previous scheduler leaves in param groups; a rebuilt scheduler must not inherit them.
_SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum")


class PerEpochLR(sched.LRScheduler):
    """Steps `inner` once every `updates_per_epoch` calls of `step()` (unit = "epoch"): the value at
    update t is the inner schedule at t // updates_per_epoch. `last_epoch` counts updates."""

    def __init__(self, optimizer: Optimizer, inner: sched.LRScheduler, updates_per_epoch: int) -> None:
        # No super().__init__: it would step once more; the inner scheduler already did.
        self.optimizer = optimizer
        self.inner = inner
        self.updates_per_epoch = updates_per_epoch
        self.last_epoch = 0
        self._step_count = 1
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]  # SequentialLR has none
        self._last_lr = inner.get_last_lr()

    def step(self, epoch: int | None = None) -> None:  # type: ignore[override]
        if epoch is not None:
            raise TypeError("PerEpochLR.step() counts updates itself; call it without an argument")
        self._step_count += 1
        self.last_epoch += 1
        if self.last_epoch % self.updates_per_epoch == 0:
            self.inner.step()
        self._last_lr = self.inner.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "inner")}
        state["inner"] = self.inner.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        self.inner.load_state_dict(state.pop("inner"))
        self.__dict__.update(state)


class MetricPlateau(sched.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau that the update loop may step like any scheduler: `step()` without
    a metric (after every update) changes nothing; `step(metric)` is ReduceLROnPlateau's step."""

    def step(self, metrics: float | None = None, epoch: int | None = None) -> None:  # type: ignore[override]
        if metrics is not None:
            super().step(metrics)


def _factor(optimizer: Optimizer, value: Callable[[int], float]) -> sched.LambdaLR:
    return sched.LambdaLR(optimizer, value)  # a factor of every group's base lr, where torch has no class


def _warmup(optimizer: Optimizer, spec: ScheduleSpec) -> sched.LRScheduler:
    w, sf = spec.warmup_steps, spec.start_factor
    if 0 < sf <= 1:
        return sched.LinearLR(optimizer, start_factor=sf, end_factor=1.0, total_iters=w)
    return _factor(optimizer, lambda s: sf + (1.0 - sf) * s / w)  # LinearLR: 0 < start_factor <= 1


def _ratio(value: Callable[[int], float], base: float) -> Callable[[int], float]:
    # LambdaLR multiplies the base lr; a base lr of 0 stays 0 (check_schedule keeps eta_min <= base)
    return (lambda s: value(s) / base) if base > 0 else (lambda s: 0.0)


_Segment = tuple[int | None, Callable[[], sched.LRScheduler]]  # (length or None = open-ended, builder)


def _in_sequence(optimizer: Optimizer, segments: list[_Segment]) -> sched.LRScheduler:
    """One SequentialLR over segments; zero-length ones are never built. Composite schedules are
    flattened into segments because a SequentialLR nested in another fails at its milestone."""
    kept = [(n, make) for n, make in segments if n != 0]
    parts = [make() for _, make in kept]
    if len(parts) == 1:
        return parts[0]
    milestones, total = [], 0
    for n, _ in kept[:-1]:
        total += n  # type: ignore[operator]
        milestones.append(total)
    return sched.SequentialLR(optimizer, parts, milestones)


def _truncate(segments: list[_Segment], length: int | None) -> list[_Segment]:
    """The segments that fit in `length` updates (a sequential part ends at the next milestone)."""
    if length is None:
        return segments
    out: list[_Segment] = []
    left = length
    for n, make in segments:
        if left <= 0:
            break
        out.append((left if n is None else min(n, left), make))
        left -= left if n is None else min(n, left)
    return out


def _wsd_decay(spec: ScheduleSpec, base: float) -> Callable[[int], float]:
    d, eta = spec.decay_steps, spec.eta_min

    def value(s: int) -> float:
        p = min(s / d, 1.0)
        if spec.decay_type == "linear":
            shape = 1.0 - p
        elif spec.decay_type == "cosine":
            shape = (1 + math.cos(math.pi * p)) / 2
        else:
            shape = 1.0 - math.sqrt(p)
        return eta + (base - eta) * shape

    return value


def _restart_value(spec: ScheduleSpec, base: float) -> Callable[[int], float]:
    t0, mult, eta, m = spec.t_0, spec.t_mult, spec.eta_min, spec.m_mul

    def value(s: int) -> float:
        i, start, length = (s // t0, s - s % t0, t0) if mult == 1 else (0, 0, t0)  # exact integer cycles
        while s >= start + length:
            start, length, i = start + length, length * mult, i + 1
        return eta + (base - eta) * m ** i * (1 + math.cos(math.pi * (s - start) / length)) / 2

    return value


def _make(spec: ScheduleSpec, optimizer: Optimizer, base: list[float]) -> sched.LRScheduler:
    name = spec.name
    if name == "constant":
        return sched.ConstantLR(optimizer, factor=spec.factor or 1.0, total_iters=spec.total_iters or 1)
    if name in ("step", "exponential") and spec.end_factor is not None:
        k = spec.step_size if name == "step" else 1
        bound = max if spec.gamma < 1 else min  # optax's end_value: a floor, or a ceiling for gamma > 1
        return _factor(optimizer, lambda s: bound(spec.gamma ** (s // k), spec.end_factor))
    if name == "step":
        return sched.StepLR(optimizer, step_size=spec.step_size, gamma=spec.gamma)
    if name == "multistep":
        return sched.MultiStepLR(optimizer, milestones=list(spec.milestones), gamma=spec.gamma)
    if name == "exponential":
        return sched.ExponentialLR(optimizer, gamma=spec.gamma)
    if name == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=spec.t_max, eta_min=spec.eta_min)
    if name == "linear":
        n, sf, ef = spec.total_iters, spec.start_factor, spec.end_factor
        if sf > 1 or ef > 1:  # optax's linear_schedule may start or end above the base lr; LinearLR may not
            return _factor(optimizer, lambda s: sf + (ef - sf) * min(s, n) / n)
        return sched.LinearLR(optimizer, start_factor=sf, end_factor=ef, total_iters=n)
    if name == "polynomial":
        n, ef, p = spec.total_iters, spec.end_factor, spec.power
        if ef:  # optax's polynomial_schedule(end_value); PolynomialLR decays to 0
            return _factor(optimizer, lambda s: ef + (1.0 - ef) * (1.0 - min(s, n) / n) ** p)
        return sched.PolynomialLR(optimizer, total_iters=n, power=p)
    if name == "onecycle":
        return sched.OneCycleLR(
            optimizer, max_lr=list(base), total_steps=spec.total_steps, pct_start=float(spec.pct_start),
            anneal_strategy=spec.anneal_strategy, cycle_momentum=spec.cycle_momentum,
            base_momentum=spec.base_momentum, max_momentum=spec.max_momentum,
            div_factor=spec.div_factor, final_div_factor=spec.final_div_factor, three_phase=spec.three_phase,
        )
    if name == "cosine_restarts" and spec.m_mul != 1:  # Keras's CosineDecayRestarts(m_mul)
        return sched.LambdaLR(optimizer, [_ratio(_restart_value(spec, b), b) for b in base])
    if name == "cosine_restarts":
        return sched.CosineAnnealingWarmRestarts(optimizer, T_0=spec.t_0, T_mult=spec.t_mult, eta_min=spec.eta_min)
    if name == "chained":
        return sched.ChainedScheduler([_make(p, optimizer, base) for p in spec.schedulers], optimizer)
    if name == "cyclic":
        return sched.CyclicLR(
            optimizer, base_lr=list(base), max_lr=spec.max_lr, step_size_up=spec.step_size_up,
            step_size_down=spec.step_size_down, mode=spec.mode, gamma=spec.gamma, scale_mode=spec.scale_mode,
            cycle_momentum=spec.cycle_momentum, base_momentum=spec.base_momentum, max_momentum=spec.max_momentum,
        )
    if name == "reduce_on_plateau":
        return MetricPlateau(optimizer, mode=spec.mode, factor=spec.factor, patience=spec.patience,
                             threshold=spec.threshold, threshold_mode=spec.threshold_mode, cooldown=spec.cooldown,
                             min_lr=spec.min_lr, eps=spec.eps)
    if name == "tabulated":
        table, last = list(spec.factors), len(spec.factors) - 1
        return sched.LambdaLR(optimizer, lambda s: table[min(s, last)])
    if name in ("warmup_cosine", "inverse_sqrt", "wsd", "sequential"):
        return _in_sequence(optimizer, _segments(spec, optimizer, base))
    raise ConfigError(f"schedule.name {name!r} has no torch scheduler")


def _segments(spec: ScheduleSpec, optimizer: Optimizer, base: list[float]) -> list[_Segment]:
    """A schedule as consecutive (length, scheduler builder) segments, each restarting at step 0."""
    name, o = spec.name, optimizer
    warm = (spec.warmup_steps or 0, lambda: _warmup(o, spec))
    if name == "warmup_cosine":
        w, total, eta = spec.warmup_steps, spec.total_steps, spec.eta_min
        cos = lambda: sched.CosineAnnealingLR(o, T_max=total - w, eta_min=eta)  # noqa: E731
        if spec.convention == "torch":
            return [warm, (None, cos)]
        # optax holds eta_min after total_steps; torch's cosine would climb back
        hold = lambda: sched.LambdaLR(o, [_ratio(lambda s: eta, b) for b in base])  # noqa: E731
        return [warm, (total - w, cos), (None, hold)]
    if name == "inverse_sqrt":
        tau = spec.timescale
        return [warm, (None, lambda: sched.LambdaLR(o, lambda s: math.sqrt(tau / (s + tau))))]
    if name == "wsd":
        w, d, total = spec.warmup_steps, spec.decay_steps, spec.total_steps
        stable = lambda: sched.ConstantLR(o, factor=1.0, total_iters=1)  # noqa: E731
        decay = lambda: sched.LambdaLR(o, [_ratio(_wsd_decay(spec, b), b) for b in base])  # noqa: E731
        return [warm, (total - w - d, stable), (None, decay)]
    if name == "sequential":
        bounds = [0, *spec.milestones]
        out: list[_Segment] = []
        for i, part in enumerate(spec.schedulers):
            length = bounds[i + 1] - bounds[i] if i + 1 < len(bounds) else None
            out.extend(_truncate(_segments(part, o, base), length))
        return out
    return [(None, lambda: _make(spec, o, base))]


def build_scheduler(
    spec: ScheduleSpec,
    optimizer: Optimizer,
    updates_per_epoch: int = 1,
    base_lrs: Sequence[float] | None = None,
    start: int = 0,
) -> sched.LRScheduler:
    """Every param group's lr schedule for `spec` (and its cycled momentum or beta1, where the
    spec cycles one), advanced once per optimizer update (not on updates skipped under
    precision.schedule_on_skip = "hold")."""
    # A torch LRScheduler, stepped after `optimizer.step()`. `base_lrs` (one per param group;
    # default: the groups' current lr) are written into the groups first, so that a scheduler can be
    # rebuilt on an optimizer whose state was loaded. `start` = t rebuilds it at update t: the groups
    # then hold the lr (and cycled momentum) update t applies, exactly as after t steps of an
    # uninterrupted run. `state_dict()` / `load_state_dict()` also round-trip.
    groups = optimizer.param_groups
    base = [float(g["lr"]) for g in groups] if base_lrs is None else [float(b) for b in base_lrs]
    if len(base) != len(groups):
        raise InputError(f"base_lrs has {len(base)} entries; the optimizer has {len(groups)} param groups")
    if updates_per_epoch < 1 or (spec.unit == "update" and updates_per_epoch != 1):
        raise InputError(f"updates_per_epoch must be 1 for unit = 'update' and >= 1 for unit = "
                         f"'epoch'; received {updates_per_epoch}")
    for group, lr in zip(groups, base):
        for key in _SCHEDULER_KEYS:
            group.pop(key, None)
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)  # a tensor lr (capturable / fused optimizers) keeps its identity
        else:
            group["lr"] = lr
    with warnings.catch_warnings():
        # replaying t updates without optimizer.step() is intended here, and so is the step a
        # SequentialLR gives a chained first part when it is built (S-SEQ-CHAINED)
        warnings.filterwarnings("ignore", message=_STEP_ORDER)
        scheduler = _make(spec, optimizer, start_lrs(spec, base))
        if spec.unit == "epoch":
            scheduler = PerEpochLR(optimizer, scheduler, updates_per_epoch)
        for _ in range(start):
            scheduler.step()
    return scheduler


class HyperSchedules:
    """The lr scheduler and [schedule.hyper]'s schedules, stepped together (`step()`): each key's
    values ride on a stand-in optimizer's lrs, moved by the torch scheduler of its own spec, and
    are written into every param group that reads the key (torch has no scheduler for other
    hyper-parameters; a training loop sets param_group[key] itself, as modded-nanogpt does)."""

    def __init__(self, scheduler: Any, optimizer: Optimizer, spec: ScheduleSpec, updates_per_epoch: int,
                 start: int) -> None:
        self.scheduler, self.optimizer = scheduler, optimizer
        self.parts: list[tuple[str, Any, Optimizer, list[bool]]] = []
        for key, part in (spec.hyper or {}).items():
            bases = [None if (v := hyper_value(key, g)) is None else float(v) for g in optimizer.param_groups]
            self.parts.append((key, *_stand_in(part, bases, updates_per_epoch, start), [b is not None for b in bases]))
        self._write()

    def step(self) -> None:
        """Advance the lr and every hyper-parameter by one update and set the groups' values."""
        self.scheduler.step()
        for _, scheduler, _, _ in self.parts:
            _quiet_step(scheduler)
        self._write()

    def _write(self) -> None:
        for key, _, stand_in, reads in self.parts:
            for group, shadow, read in zip(self.optimizer.param_groups, stand_in.param_groups, reads, strict=True):
                if read:
                    field, value = hyper_field(key, group, float(shadow["lr"]))
                    group[field] = value


def _stand_in(spec: ScheduleSpec, bases: Sequence[float | None], updates_per_epoch: int,
              start: int = 0) -> tuple[Any, Optimizer]:
    """(scheduler of `spec`, the stand-in SGD it moves): one group per base, whose lr carries the
    hyper-parameter's value (0 where a group does not read it)."""
    stand_in = torch.optim.SGD([{"params": [torch.zeros(1, dtype=torch.float64)], "lr": 0.0 if b is None else b}
                                for b in bases])
    return build_scheduler(spec, stand_in, updates_per_epoch, start=start), stand_in


def _quiet_step(scheduler: Any) -> None:
    with warnings.catch_warnings():  # a stand-in optimizer never steps: its scheduler carries values only
        warnings.filterwarnings("ignore", message=_STEP_ORDER)
        scheduler.step()


def hyper_values(spec: ScheduleSpec, bases: Sequence[float | None], n: int, updates_per_epoch: int = 1) -> Any:
    """A hyper-parameter's values at updates 0..n-1: its scheduler stepped on a stand-in optimizer
    whose lrs carry them (as HyperSchedules does), NaN where a group does not read it (a (n, groups) array)."""
    scheduler, opt = _stand_in(spec, bases, updates_per_epoch)
    out = np.empty((n, len(bases)))
    for t in range(n):
        out[t] = [np.nan if b is None else float(g["lr"]) for g, b in zip(opt.param_groups, bases)]
        _quiet_step(scheduler)
    return out


def build_hyper(spec: ScheduleSpec, optimizer: Optimizer, scheduler: Any, updates_per_epoch: int = 1,
                start: int = 0) -> Any:
    """[schedule.hyper]'s schedules for every param group whose optimizer reads the key, each from
    the group's own value as the lr schedule is from its lr, advanced with the lr (the same
    position; held with it on skipped updates). Without schedule.hyper: the lr's alone."""
    # torch: the object to step after every update, `scheduler` itself when nothing else is
    # scheduled, else a HyperSchedules around it; `optimizer` as build_optimizer made it (its groups
    # hold the spec's values), `start` = t as in build_scheduler.
    if not spec.hyper:
        return scheduler
    return HyperSchedules(scheduler, optimizer, spec, updates_per_epoch, start)


def plateau_neutral(scheduler: MetricPlateau) -> Plateau:
    """The neutral plateau state (conformance.rules.plateau): best, bad observations, cooldown,
    observations and every group's lr."""
    # read from the scheduler's attributes and its optimizer's groups
    lrs = tuple(float(g["lr"]) for g in scheduler.optimizer.param_groups)
    return Plateau(float(scheduler.best), int(scheduler.num_bad_epochs), int(scheduler.cooldown_counter),
                   int(scheduler.last_epoch), lrs)


def plateau_from_neutral(scheduler: MetricPlateau, state: Plateau) -> None:
    """The plateau state from its neutral form (conformance.rules.plateau), lrs included."""
    # put in place: into the scheduler's attributes and its optimizer's groups
    scheduler.best, scheduler.num_bad_epochs = state.best, state.num_bad_epochs
    scheduler.cooldown_counter, scheduler.last_epoch = state.cooldown_counter, state.observed
    for group, lr in zip(scheduler.optimizer.param_groups, state.lrs, strict=True):
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    scheduler._last_lr = [float(x) for x in state.lrs]
