"""kind = "schedule": the learning rate (and cycled momentum) each update applies.

    [optimizer]  lr = base lr (and [[optimizer.groups]] with their own lr)
    [schedule]   the schedule under test
    [inputs]     steps (updates t = 0..steps-1); updates_per_epoch (only with unit = "epoch", default 1)
    [expected]   lr: values at t = 0..steps-1, one list when there is one param group, else a list of
                 rows [lr of each group] (groups in file order, the default group last);
                 optional momentum: onecycle's cycled momentum / beta1, shaped like lr

Every backend runs `schedules.schedule_values(schedule, optimizer, steps, updates_per_epoch)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.config.base import PosInt
from conformance.harness.arrays import Array, CaseTable
from conformance.harness.backends import Backend
from conformance.harness.case import Case
from conformance.rules.groups import group_base_lrs

REQUIRED_SECTIONS = ("optimizer", "schedule")


class Inputs(CaseTable):
    steps: PosInt
    updates_per_epoch: PosInt = 1


class Expected(CaseTable):
    lr: Array
    momentum: Array | None = None


def check_case(case: Case) -> None:
    steps = case.inputs.steps
    groups = len(group_base_lrs(case.sections["optimizer"]))
    for name in ("lr", "momentum"):
        want = getattr(case.expected, name)
        if want is None:
            continue
        shape = (steps,) if groups == 1 and want.ndim == 1 else (steps, groups)
        if want.shape != shape:
            raise ValueError(
                f"expected.{name} has shape {want.shape}; inputs.steps = {steps} with {groups} param "
                f"group(s) needs {shape}" + (" (one row of per-group values per update)" if groups > 1 else "")
            )
    schedule = case.sections["schedule"]
    if case.inputs.updates_per_epoch != 1 and schedule.unit != "epoch":
        raise ValueError("inputs.updates_per_epoch is only read with schedule.unit = 'epoch'")
    if case.expected.momentum is not None and not (schedule.name == "onecycle" and schedule.cycle_momentum):
        raise ValueError("expected.momentum needs schedule.name = 'onecycle' with cycle_momentum = true")


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("schedules", "schedule_values")
    out = fn(case.sections["schedule"], case.sections["optimizer"], case.inputs.steps,
             case.inputs.updates_per_epoch)
    got: dict[str, Any] = {}
    for name, want in expected_values(case).items():
        value = out[name]
        if value is None:
            got[name] = None
            continue
        value = np.asarray(value, np.float64)
        got[name] = value[:, 0] if np.ndim(want) == 1 else value
    return got


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    return {k: getattr(exp, k).astype(np.float64) for k in ("lr", "momentum") if getattr(exp, k) is not None}
