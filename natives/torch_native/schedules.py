"""torch.optim.lr_scheduler's classes for a [schedule] spec, stepped once per update after
optimizer.step() (or once per epoch of updates), reading every group's lr (and OneCycleLR's cycled
momentum / beta1) before each update.

constant → ConstantLR (with a factor), step → StepLR, multistep → MultiStepLR, exponential →
ExponentialLR, cosine → CosineAnnealingLR, linear → LinearLR, polynomial → PolynomialLR, onecycle →
OneCycleLR, cosine_restarts → CosineAnnealingWarmRestarts, warmup_cosine → SequentialLR([LinearLR,
CosineAnnealingLR]) (torch's own shape past total_steps: `convention` has no torch argument),
sequential → SequentialLR, chained → ChainedScheduler, cyclic → CyclicLR, reduce_on_plateau →
ReduceLROnPlateau (stepped with each observed metric), tabulated → LambdaLR reading the table.
inverse_sqrt and wsd have no class; a value a class refuses (LinearLR from 0 or above 1, a nested SequentialLR) is unsupported with torch's
message, and so are optax's and Keras's options torch has no argument for (`end_factor` on
exponential, step and polynomial: torch's PolynomialLR ends at 0; `m_mul` on cosine_restarts).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.optim import lr_scheduler as S

from conformance.config import OptimizerSpec, ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import check_metrics, check_schedule, spots
from natives._protocol import refuse
from natives.torch_native.optimizers import CLASSES


def scheduler(spec: ScheduleSpec, opt: torch.optim.Optimizer) -> S.LRScheduler | S.ReduceLROnPlateau | None:
    """The lr_scheduler object of the spec on `opt` (None: the constant base lr)."""
    try:
        return _make(spec, opt)
    except ValueError as exc:
        raise refuse(f"schedule.name = {spec.name!r}", f"torch refuses it: {' '.join(str(exc).split())}") from None


# options torch's classes have no argument for, at the value that is torch's own behaviour
NO_ARGUMENT = {"end_factor": {"exponential": None, "step": None, "polynomial": 0.0}, "m_mul": {"cosine_restarts": 1.0}}
CLASS_NAMES = {"exponential": "ExponentialLR", "step": "StepLR", "polynomial": "PolynomialLR",
               "cosine_restarts": "CosineAnnealingWarmRestarts"}


def _make(spec: ScheduleSpec, opt: torch.optim.Optimizer) -> S.LRScheduler | S.ReduceLROnPlateau | None:
    n = spec.name
    for field, torch_value in NO_ARGUMENT.items():
        if n in torch_value and getattr(spec, field) != torch_value[n]:
            raise refuse(f"schedule.{field} = {getattr(spec, field)!r}", f"torch.optim.lr_scheduler.{CLASS_NAMES[n]} "
                                                                         "has no such argument")
    if n == "constant":
        return None if spec.factor is None else S.ConstantLR(opt, factor=spec.factor, total_iters=spec.total_iters)
    if n == "step":
        return S.StepLR(opt, spec.step_size, spec.gamma)
    if n == "multistep":
        return S.MultiStepLR(opt, spec.milestones, spec.gamma)
    if n == "exponential":
        return S.ExponentialLR(opt, spec.gamma)
    if n == "cosine":
        return S.CosineAnnealingLR(opt, spec.t_max, spec.eta_min)
    if n == "linear":
        return S.LinearLR(opt, spec.start_factor, spec.end_factor, spec.total_iters)
    if n == "polynomial":
        return S.PolynomialLR(opt, spec.total_iters, spec.power)
    if n == "onecycle":
        peak = spec.max_lr if spec.max_lr is not None else [g["lr"] for g in opt.param_groups]
        return S.OneCycleLR(opt, peak, total_steps=spec.total_steps, pct_start=spec.pct_start,
                            anneal_strategy=spec.anneal_strategy, cycle_momentum=spec.cycle_momentum,
                            base_momentum=spec.base_momentum, max_momentum=spec.max_momentum,
                            div_factor=spec.div_factor, final_div_factor=spec.final_div_factor,
                            three_phase=spec.three_phase)
    if n == "cosine_restarts":
        return S.CosineAnnealingWarmRestarts(opt, spec.t_0, spec.t_mult, spec.eta_min)
    if n == "chained":
        return S.ChainedScheduler([_make(p, opt) or S.ConstantLR(opt, factor=1.0, total_iters=0)
                                   for p in spec.schedulers or []], opt)
    if n == "cyclic":
        base = spec.base_lr if spec.base_lr is not None else [g["lr"] for g in opt.param_groups]
        return S.CyclicLR(opt, base, spec.max_lr, spec.step_size_up, spec.step_size_down, spec.mode, spec.gamma,
                          scale_mode=spec.scale_mode, cycle_momentum=spec.cycle_momentum,
                          base_momentum=spec.base_momentum, max_momentum=spec.max_momentum)
    if n == "reduce_on_plateau":
        return S.ReduceLROnPlateau(opt, spec.mode, spec.factor, spec.patience, spec.threshold, spec.threshold_mode,
                                   spec.cooldown, spec.min_lr, spec.eps)
    if n == "tabulated":
        table, last = list(spec.factors), len(spec.factors) - 1
        return S.LambdaLR(opt, lambda s: table[min(s, last)])
    if n in ("warmup_cosine", "sequential"):
        parts, milestones = _flat(spec, opt)
        return parts[0] if len(parts) == 1 else S.SequentialLR(opt, parts, milestones)
    raise refuse(f"schedule.name = {n!r}", "torch.optim.lr_scheduler has no such class")


def _flat(spec: ScheduleSpec, opt: torch.optim.Optimizer) -> tuple[list[S.LRScheduler], list[int]]:
    """The parts and milestones of one SequentialLR: torch cannot nest SequentialLR, so a torch user
    writes warmup_cosine (LinearLR then CosineAnnealingLR) and sequential parts into one list."""
    if spec.name == "warmup_cosine":
        decay = S.CosineAnnealingLR(opt, spec.total_steps - spec.warmup_steps, spec.eta_min)
        if spec.warmup_steps == 0:
            return [decay], []
        return [S.LinearLR(opt, spec.start_factor, 1.0, spec.warmup_steps), decay], [spec.warmup_steps]
    if spec.name != "sequential":
        return [_make(spec, opt) or S.ConstantLR(opt, factor=1.0, total_iters=0)], []
    parts: list[S.LRScheduler] = []
    milestones: list[int] = []
    for start, part in zip([0, *spec.milestones], spec.schedulers):
        inner, marks = _flat(part, opt)
        if parts:
            milestones.append(start)
        parts += inner
        milestones += [start + m for m in marks]
    return parts, milestones


def holder(optimizer: OptimizerSpec) -> torch.optim.Optimizer:
    """A torch optimizer of the spec's class (SGD where torch has none) with one parameter per group at
    the group's lr: what OneCycleLR cycles (momentum or betas) depends on the class."""
    cls = CLASSES.get(optimizer.name, torch.optim.SGD)
    cls = torch.optim.SGD if cls is torch.optim.Muon else cls
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], "lr": lr}
              for lr in group_base_lrs(optimizer)]
    return cls(groups)


def schedule_values(schedule: ScheduleSpec, optimizer: OptimizerSpec, steps: int, updates_per_epoch: int = 1, *,
                    at: list[int] | None = None, metrics: list[float] | None = None) -> dict[str, Any]:
    """Every group's lr at updates 0..steps-1 (or the `at` updates) from the lr_scheduler object, and
    the cycled momentum; ReduceLROnPlateau steps with the metric observed after each update."""
    check_schedule(schedule, optimizer, steps, updates_per_epoch)
    observed = check_metrics(schedule, metrics, steps)
    rows = spots(steps, at)
    if schedule.name in ("onecycle", "cyclic") and schedule.cycle_momentum and optimizer.name not in CLASSES:
        raise refuse(f"optimizer.name = {optimizer.name!r}", f"{schedule.name} cycles the momentum of a torch.optim "
                                                             "class; torch.optim has none of this name")
    opt = holder(optimizer)
    sched = scheduler(schedule, opt)
    cycled = schedule.name in ("onecycle", "cyclic") and schedule.cycle_momentum
    plateau = isinstance(sched, S.ReduceLROnPlateau)
    lr, mom = [], []
    last = int(rows[-1])
    for t in range(last + 1):
        lr.append([float(g["lr"]) for g in opt.param_groups])
        mom.append([float(g["betas"][0] if "betas" in g else g["momentum"]) for g in opt.param_groups]
                   if cycled else [])
        opt.step()
        if plateau and observed is not None:
            sched.step(float(observed[t]))  # type: ignore[union-attr]
        elif sched is not None and not plateau and (t + 1) % updates_per_epoch == 0 and t < last:
            sched.step()
    return {"lr": np.array(lr)[rows], "momentum": np.array(mom)[rows] if cycled else None}
