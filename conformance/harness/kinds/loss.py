"""kind = "loss": a loss's value (and optionally its gradient, sum and count) on given inputs.

    [inputs]   prediction, target, optional weight (torch's `weight` argument as an array), mask
               (booleans or 0/1), sample_weight (per-sample multipliers, docs/contract.md §3)
    [expected] value; optional grad (d value / d prediction), sum, count (mean = sum / count)

Integer targets stay integers (class indices); for losses that take float targets an integer
array is read as floats. With reduction = "none", `value` is the per-element loss (compared
element by element) and `grad` is d(Σ value)/d(prediction); otherwise `value` is one number.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.errors import CaseError
from conformance.harness.arrays import Array, CaseTable, round_to
from conformance.harness.backends import Backend, require_parameters
from conformance.harness.case import Case
from conformance.rules.inputs import INDEX_LOSSES, element_shape

REQUIRED_SECTIONS = ("loss",)


class Inputs(CaseTable):
    prediction: Array
    target: Array
    weight: Array | None = None
    mask: Array | None = None
    sample_weight: Array | None = None


class Expected(CaseTable):
    value: Array
    grad: Array | None = None
    sum: float | None = None
    count: float | None = None


def check_case(case: Case) -> None:
    """Refuse a case whose expected values cannot mean what the inputs say (CaseError, one line)."""
    spec, inp, exp = case.sections["loss"], case.inputs, case.expected
    if inp.weight is not None and spec.weight is not None:
        raise CaseError("give weight either in [loss] or in [inputs], not both")
    shape = element_shape(spec, inp.prediction, inp.target)
    if spec.reduction == "none" and exp.value.shape != shape:
        raise CaseError(f"expected.value must hold one loss per element, shape {shape}, for reduction = "
                        f"'none'; received shape {exp.value.shape}")
    if spec.reduction != "none" and exp.value.shape != ():
        raise CaseError(f"expected.value must be one number for reduction = {spec.reduction!r}; received "
                        f"shape {exp.value.shape} (per-element values need reduction = 'none')")
    if exp.grad is not None and exp.grad.shape != inp.prediction.shape:
        raise CaseError(f"expected.grad must have the prediction's shape {inp.prediction.shape}; "
                        f"received {exp.grad.shape}")
    sw = inp.sample_weight
    if sw is not None and (sw.ndim > len(shape) or sw.shape != shape[:sw.ndim]):
        raise CaseError(f"inputs.sample_weight shape {sw.shape} must be the leading dimensions of the "
                        f"per-element loss shape {shape} (one weight per sample: {shape[:1]})")


def arrays(case: Case) -> dict[str, Any]:
    """The case's inputs as NumPy arrays, rounded to the case dtype (identical on every backend).
    `sample_weight` is present only when the case gives it (backends without it still run the rest)."""
    spec = case.sections["loss"]
    inp = case.inputs
    target = inp.target
    if spec.name not in INDEX_LOSSES and np.issubdtype(target.dtype, np.integer):
        target = target.astype(np.float64)
    out = {
        "prediction": round_to(inp.prediction.astype(np.float64), case.dtype),
        "target": round_to(target, case.dtype),
        "weight": None if inp.weight is None else round_to(inp.weight.astype(np.float64), case.dtype),
        "mask": inp.mask,
    }
    if inp.sample_weight is not None:
        out["sample_weight"] = round_to(inp.sample_weight.astype(np.float64), case.dtype)
    return out


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("losses", "loss_value_and_grad")
    inputs = arrays(case)
    require_parameters(backend.name, fn, "losses.loss_value_and_grad", [k for k in ("sample_weight",) if k in inputs])
    out = fn(case.sections["loss"], dtype=case.dtype, **inputs)
    return {k: out[k] for k in expected_values(case)}


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    return {k: getattr(exp, k) for k in ("value", "grad", "sum", "count") if getattr(exp, k) is not None}
