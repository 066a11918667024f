"""kind = "loss": a loss's value (and optionally its gradient, sum and count) on given inputs.

    [inputs]   prediction, target, optional weight (torch's `weight` argument as an array), mask
    [expected] value; optional grad (d value / d prediction), sum, count (mean = sum / count)

Integer targets stay integers (class indices); for losses that take float targets an integer
array is read as floats.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.harness.arrays import Array, CaseTable, round_to
from conformance.harness.backends import Backend
from conformance.harness.case import Case

REQUIRED_SECTIONS = ("loss",)


class Inputs(CaseTable):
    prediction: Array
    target: Array
    weight: Array | None = None
    mask: Array | None = None


class Expected(CaseTable):
    value: Array
    grad: Array | None = None
    sum: float | None = None
    count: float | None = None


def check_case(case: Case) -> None:
    if case.inputs.weight is not None and case.sections["loss"].weight is not None:
        raise ValueError("give weight either in [loss] or in [inputs], not both")


def arrays(case: Case) -> dict[str, Any]:
    """The case's inputs as NumPy arrays, rounded to the case dtype (identical on every backend)."""
    spec = case.sections["loss"]
    inp = case.inputs
    target = inp.target
    if spec.name not in ("cross_entropy", "nll") and np.issubdtype(target.dtype, np.integer):
        target = target.astype(np.float64)
    return {
        "prediction": round_to(inp.prediction.astype(np.float64), case.dtype),
        "target": round_to(target, case.dtype),
        "weight": None if inp.weight is None else round_to(inp.weight.astype(np.float64), case.dtype),
        "mask": inp.mask,
    }


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("losses", "loss_value_and_grad")
    out = fn(case.sections["loss"], dtype=case.dtype, **arrays(case))
    return {k: out[k] for k in expected_values(case)}


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    return {k: getattr(exp, k) for k in ("value", "grad", "sum", "count") if getattr(exp, k) is not None}
