"""kind = "clip": gradients clipped by a [clip] spec, and the norm before clipping.

    [clip]     max_norm / norm_type / eps / per_parameter, or clip_value (conformance.config.clip)
    [inputs]   grads = { w = [...], b = [...] }          (a parameter set)
    [expected] grads = { ... } (after clipping); total_norm (before clipping)

Non-finite gradients are written as TOML `nan` / `inf`; with `error_if_nonfinite = true` a case can
expect `error = "NonFiniteError"`. Calls `clipping.clip_and_norm(spec, grads, dtype)`.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field

from conformance.harness.arrays import Array, CaseTable, round_to
from conformance.harness.backends import Backend
from conformance.harness.case import Case

REQUIRED_SECTIONS = ("clip",)


class Inputs(CaseTable):
    grads: dict[str, Array]


class Expected(CaseTable):
    grads: dict[str, Array]
    total_norm: Annotated[float, Field(allow_inf_nan=True)] | None = None


def _as_float(arr: np.ndarray) -> np.ndarray:
    return arr.astype(np.float64)


def check_case(case: Case) -> None:
    got, want = case.inputs.grads, case.expected.grads
    if not got:
        raise ValueError("inputs.grads must name at least one parameter")
    if set(got) != set(want):
        raise ValueError(f"expected.grads names {sorted(want)} but inputs.grads has {sorted(got)}")
    for name in got:
        if got[name].shape != want[name].shape:
            raise ValueError(f"expected.grads.{name} has shape {want[name].shape}; inputs.grads.{name} "
                             f"has {got[name].shape}")


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("clipping", "clip_and_norm")
    grads = {k: round_to(_as_float(v), case.dtype) for k, v in case.inputs.grads.items()}
    out = fn(case.sections["clip"], grads, dtype=case.dtype)
    if case.expects_error:
        return out
    return {k: out[k] for k in expected_values(case)}


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    want: dict[str, Any] = {"grads": {k: _as_float(v) for k, v in exp.grads.items()}}
    if exp.total_norm is not None:
        want["total_norm"] = exp.total_norm
    return want
