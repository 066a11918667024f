"""kind = "loss_scale": the dynamic loss-scale state machine over a sequence of updates.

    [precision] loss_scale = "dynamic" (or dtype = "float16"), init_scale, growth_factor,
                backoff_factor, growth_interval, max_consecutive_skips
    [inputs]    finite = [true, false, ...]        (one flag per update: were all gradients finite?)
    [expected]  scale = [...]    (the scale in force at each update, i.e. before its update())
                skipped = [...]  (was the optimizer step skipped)
                growth_tracker = [...]  (optional; after each update)

A run that skips more than max_consecutive_skips updates in a row can expect
`error = "NonFiniteError"`. Calls `precision.loss_scale_trace(spec, finite)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from conformance.harness.arrays import CaseTable
from conformance.harness.backends import Backend
from conformance.harness.case import Case

REQUIRED_SECTIONS = ("precision",)


class Inputs(CaseTable):
    finite: list[bool] = Field(min_length=1)


class Expected(CaseTable):
    scale: list[float]
    skipped: list[bool]
    growth_tracker: list[int] | None = None


def check_case(case: Case) -> None:
    spec = case.sections["precision"]
    if not spec.dynamic_scaling:
        raise ValueError("[precision] must enable dynamic loss scaling (loss_scale = 'dynamic' or dtype = 'float16')")
    n = len(case.inputs.finite)
    exp = case.expected
    for name in ("scale", "skipped", "growth_tracker"):
        values = getattr(exp, name)
        if values is not None and len(values) != n:
            raise ValueError(f"expected.{name} has {len(values)} entries; inputs.finite has {n}")


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("precision", "loss_scale_trace")
    out = fn(case.sections["precision"], list(case.inputs.finite), dtype=case.dtype)
    if case.expects_error:
        return out
    return {k: out[k] for k in expected_values(case)}


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    want: dict[str, Any] = {"scale": exp.scale, "skipped": np.array(exp.skipped, bool)}
    if exp.growth_tracker is not None:
        want["growth_tracker"] = exp.growth_tracker
    return want
