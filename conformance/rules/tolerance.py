"""Tolerances: when two numbers count as the same, for a conformance case and for a whole run.

A value passes when |got − want| <= atol + rtol·|want| (`want`: the expected value, or the reference
run). One table, by dtype, with two scopes:

- "case": one operation against a worked example (docs/contract.md §3 defaults; a case file may set its own);
- "run": a training run against another, update by update (`twinstep compare`).

float64 is the same in both scopes (measured at most 6e-14 relative over the full bundled runs).
float32 runs: the measured torch-vs-JAX maxima over the full bundled runs are 4.5e-5 (loss), 3.7e-5
(grad_norm) and 5.8e-8 (lr: float32 rounding of the double-precision schedule) relative; rtol 2e-4
keeps a 4x margin and still fails an off-by-one schedule (7% at its first update) or a changed clip
eps. atol 1e-6: where a quantity converges to 0 (linear_regression ends at loss 1e-10, grad norm
1e-5) one ulp of a parameter of size 3 (2.4e-7) moves the grad norm by ~3e-7, which no rtol covers.
float16/bfloat16 runs: the case defaults; the JAX models run torch.autocast's op-level semantics,
measured 8.7e-5 (float16) and 8.9e-4 (bfloat16) relative on seed_binary's 160 updates.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Scope = Literal["case", "run"]


class Tolerance(NamedTuple):
    """|got − want| <= atol + rtol·|want|."""

    atol: float
    rtol: float


TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "float64": {"case": Tolerance(1e-12, 1e-10), "run": Tolerance(1e-12, 1e-10)},
    "float32": {"case": Tolerance(1e-6, 1e-5), "run": Tolerance(1e-6, 2e-4)},
    "bfloat16": {"case": Tolerance(1e-3, 1e-2), "run": Tolerance(1e-3, 1e-2)},
    "float16": {"case": Tolerance(1e-3, 1e-2), "run": Tolerance(1e-3, 1e-2)},
}


def default_tolerance(dtype: str, scope: Scope = "case") -> Tolerance:
    """The default tolerance of `dtype` ("float64", "float32", "bfloat16", "float16") in `scope`."""
    return TOLERANCES[dtype][scope]


def loosest(tolerances: list[Tolerance]) -> Tolerance:
    """The tolerance that accepts whatever any of `tolerances` accepts (largest atol and rtol)."""
    return Tolerance(max(t.atol for t in tolerances), max(t.rtol for t in tolerances))
