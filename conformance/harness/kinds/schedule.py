"""kind = "schedule": the learning rate (and cycled momentum) each update applies.

    [optimizer]  lr = base lr (and [[optimizer.groups]] with their own lr)
    [schedule]   the schedule under test
    [inputs]     steps (updates t = 0..steps-1); updates_per_epoch (only with unit = "epoch", default 1);
                 at = [t, ...]: spot updates (strictly increasing, each < steps) whose values are
                 expected instead of every update's (steps defaults to at[-1] + 1);
                 metrics = [m_0, ...]: reduce_on_plateau only, the value observed after each
                 update t (one per update: len = steps)
    [expected]   lr: values at t = 0..steps-1 (or at the `at` updates), one list when there is one
                 param group, else a list of rows [lr of each group] (groups in file order, the
                 default group last); optional momentum: onecycle's / cyclic's cycled momentum /
                 beta1, shaped like lr; optional hyper = {key = values}: each [schedule.hyper.<key>]
                 value, shaped like lr, nan in the groups whose optimizer does not read the key

Every backend runs `schedules.schedule_values(schedule, optimizer, steps, updates_per_epoch)`,
with `at=` and `metrics=` only when the case gives them (so a backend without them still runs
the other cases).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.config.base import PosInt
from conformance.errors import UnsupportedError
from conformance.harness.arrays import Array, CaseTable
from conformance.harness.backends import Backend, require_parameters
from conformance.harness.case import Case
from conformance.rules.groups import group_base_lrs

REQUIRED_SECTIONS = ("optimizer", "schedule")


class Inputs(CaseTable):
    steps: PosInt | None = None
    updates_per_epoch: PosInt = 1
    at: list[int] | None = None
    metrics: Array | None = None


class Expected(CaseTable):
    lr: Array
    momentum: Array | None = None
    hyper: dict[str, Array] | None = None


def steps(case: Case) -> int:
    """The updates the case runs: inputs.steps, or one past the last `at` update."""
    given = case.inputs.steps
    return given if given is not None else case.inputs.at[-1] + 1


def _check_inputs(case: Case) -> None:
    inputs, schedule = case.inputs, case.sections["schedule"]
    if inputs.steps is None and inputs.at is None:
        raise ValueError("inputs.steps is required (or inputs.at, the spot updates)")
    at = inputs.at
    if at is not None:
        if not at:
            raise ValueError("inputs.at must list at least one update")
        for i, t in enumerate(at):
            if t < 0 or (i and t <= at[i - 1]):
                raise ValueError(f"inputs.at[{i}] = {t} must be >= 0 and greater than the update before it "
                                 f"(at lists updates in increasing order)")
        if inputs.steps is not None and at[-1] >= inputs.steps:
            raise ValueError(f"inputs.at[{len(at) - 1}] = {at[-1]} is not an update of inputs.steps = {inputs.steps} "
                             f"(updates 0..{inputs.steps - 1})")
    plateau = schedule.name == "reduce_on_plateau"
    if inputs.metrics is not None and not plateau:
        raise ValueError(f"inputs.metrics is read only by schedule.name = 'reduce_on_plateau' (a schedule that "
                         f"observes a metric); received it with name = {schedule.name!r}")
    if plateau and inputs.metrics is None:
        raise ValueError("inputs.metrics is required for schedule.name = 'reduce_on_plateau' (the value observed "
                         "after each update)")
    if inputs.metrics is not None and inputs.metrics.shape != (steps(case),):
        raise ValueError(f"inputs.metrics must hold one number per update ({steps(case)}); received shape "
                         f"{inputs.metrics.shape}")
    if inputs.updates_per_epoch != 1 and schedule.unit != "epoch":
        raise ValueError("inputs.updates_per_epoch is only read with schedule.unit = 'epoch'")


def check_case(case: Case) -> None:
    _check_inputs(case)
    rows = len(case.inputs.at) if case.inputs.at is not None else steps(case)
    what = "len(inputs.at)" if case.inputs.at is not None else "inputs.steps"
    groups = len(group_base_lrs(case.sections["optimizer"]))
    schedule = case.sections["schedule"]
    hyper = case.expected.hyper or {}
    unknown = sorted(set(hyper) - set(schedule.hyper or {}))
    if unknown:
        raise ValueError(f"expected.hyper.{unknown[0]} has no [schedule.hyper.{unknown[0]}] to come from")
    for name, want in [("lr", case.expected.lr), ("momentum", case.expected.momentum),
                       *((f"hyper.{k}", v) for k, v in hyper.items())]:
        if want is None:
            continue
        shape = (rows,) if groups == 1 and want.ndim == 1 else (rows, groups)
        if want.shape != shape:
            raise ValueError(
                f"expected.{name} has shape {want.shape}; {what} = {rows} with {groups} param "
                f"group(s) needs {shape}" + (" (one row of per-group values per update)" if groups > 1 else "")
            )
    if case.expected.momentum is not None and not (schedule.name in ("onecycle", "cyclic") and schedule.cycle_momentum):
        raise ValueError("expected.momentum needs schedule.name = 'onecycle' or 'cyclic' with cycle_momentum = true")


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("schedules", "schedule_values")
    extra: dict[str, Any] = {}
    if case.inputs.at is not None:
        extra["at"] = list(case.inputs.at)
    if case.inputs.metrics is not None:
        extra["metrics"] = case.inputs.metrics.astype(np.float64).tolist()
    require_parameters(backend.name, fn, "schedules.schedule_values", extra)
    out = fn(case.sections["schedule"], case.sections["optimizer"], steps(case), case.inputs.updates_per_epoch,
             **extra)
    if case.expected.hyper and not isinstance(out.get("hyper"), dict):
        raise UnsupportedError(f"{backend.name}'s schedules.schedule_values returns no 'hyper' values (the "
                               "[schedule.hyper] hyper-parameters per update)")
    got: dict[str, Any] = {}
    for name, want in expected_values(case).items():
        value = out["hyper"][name[len("hyper."):]] if name.startswith("hyper.") else out[name]
        if value is None:
            got[name] = None
            continue
        value = np.asarray(value, np.float64)
        got[name] = value[:, 0] if np.ndim(want) == 1 else value
    return got


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    out = {k: getattr(exp, k).astype(np.float64) for k in ("lr", "momentum") if getattr(exp, k) is not None}
    return {**out, **{f"hyper.{k}": v.astype(np.float64) for k, v in (exp.hyper or {}).items()}}
