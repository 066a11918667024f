"""torch.optim.lr_scheduler's classes for a [schedule] spec, stepped once per update after
optimizer.step() (or once per epoch of updates), reading every group's lr (and OneCycleLR's cycled
momentum / beta1) before each update.

constant → ConstantLR (with a factor), step → StepLR, multistep → MultiStepLR, exponential →
ExponentialLR, cosine → CosineAnnealingLR, linear → LinearLR, polynomial → PolynomialLR, onecycle →
OneCycleLR, cosine_restarts → CosineAnnealingWarmRestarts, warmup_cosine → SequentialLR([LinearLR,
CosineAnnealingLR]) (torch's own shape past total_steps: `convention` has no torch argument),
sequential → SequentialLR. inverse_sqrt and wsd have no class; a value a class refuses (LinearLR
from 0, a nested SequentialLR) is unsupported with torch's message.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.optim import lr_scheduler as S

from conformance.config import OptimizerSpec, ScheduleSpec
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import check_schedule
from natives._protocol import refuse
from natives.torch_native.optimizers import CLASSES


def scheduler(spec: ScheduleSpec, opt: torch.optim.Optimizer) -> S.LRScheduler | None:
    """The lr_scheduler object of the spec on `opt` (None: the constant base lr)."""
    try:
        return _make(spec, opt)
    except ValueError as exc:
        raise refuse(f"schedule.name = {spec.name!r}", f"torch refuses it: {' '.join(str(exc).split())}") from None


def _make(spec: ScheduleSpec, opt: torch.optim.Optimizer) -> S.LRScheduler | None:
    n = spec.name
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


def schedule_values(schedule: ScheduleSpec, optimizer: OptimizerSpec, steps: int,
                    updates_per_epoch: int = 1) -> dict[str, Any]:
    """Every group's lr at updates 0..steps-1 from the lr_scheduler object, and the cycled momentum."""
    check_schedule(schedule, optimizer, steps, updates_per_epoch)
    if schedule.name == "onecycle" and schedule.cycle_momentum and optimizer.name not in CLASSES:
        raise refuse(f"optimizer.name = {optimizer.name!r}", "OneCycleLR cycles the momentum of a torch.optim "
                                                             "class; torch.optim has none of this name")
    opt = holder(optimizer)
    sched = scheduler(schedule, opt)
    cycled = schedule.name == "onecycle" and schedule.cycle_momentum
    lr, mom = [], []
    for t in range(steps):
        lr.append([float(g["lr"]) for g in opt.param_groups])
        mom.append([float(g["betas"][0] if "betas" in g else g["momentum"]) for g in opt.param_groups]
                   if cycled else [])
        opt.step()
        if sched is not None and (t + 1) % updates_per_epoch == 0 and t + 1 < steps:
            sched.step()
    return {"lr": np.array(lr), "momentum": np.array(mom) if cycled else None}
