"""kind = "optimizer": parameters (and optionally the optimizer state) after each update.

    [optimizer]   the spec, as in a training config (groups included)
    [inputs]      params = { w = [...], b = [...] }
                  grads = [ { w = [...], b = [...] }, { w = [...] }, ... ]   # one table per update
                  # or: objective = { kind = "quadratic", center = {...}, curvature = {...} }
                  #     steps = 3      (L = Σ curvature/2 · (p − center)², gradient at the current p)
                  state = { w = { step = 1000000, m = [...], v = [...] } }   # optional start state
    [expected]    params = [ {...after update 0...}, {...after update 1...}, ... ]
                  state = [ { w = { m = [...], v = [...], step = 1 } }, ... ]  # optional, neutral names
                  ema = [ {...EMA after update 0...}, ... ]   # optional, with an [ema] table
                  # ({} for an update after which the EMA has not started yet)

A parameter missing from an update's `grads` table has no gradient in that update (torch: `grad is
None`): it is not updated and its state, update count included, stays as it was; an empty table
`{}` is an update in which no parameter has a gradient. `[expected] state` may list a subset of
the parameters and state names (docs/contract.md §4; conformance.rules.state.state_shapes).
"""

from __future__ import annotations

from typing import Any, Literal

from conformance.config.base import NonNegInt
from conformance.harness.arrays import Array, CaseTable, ParamSet, round_to
from conformance.harness.backends import Backend
from conformance.harness.case import Case
from conformance.rules.trajectory import check_trajectory_inputs

REQUIRED_SECTIONS = ("optimizer",)

NeutralState = dict[str, dict[str, Array]]


class Objective(CaseTable):
    kind: Literal["quadratic"] = "quadratic"
    center: ParamSet
    curvature: ParamSet


class Inputs(CaseTable):
    params: ParamSet
    grads: list[ParamSet] | None = None
    objective: Objective | None = None
    steps: NonNegInt | None = None
    state: NeutralState | None = None


class Expected(CaseTable):
    params: list[ParamSet]
    state: list[NeutralState] | None = None
    ema: list[ParamSet] | None = None


def _updates(inputs: Inputs) -> int:
    if (inputs.grads is None) == (inputs.objective is None):
        raise ValueError("inputs needs either grads (one table per update) or objective with steps")
    if inputs.objective is not None:
        if inputs.steps is None:
            raise ValueError("inputs.steps is required with inputs.objective")
        return inputs.steps
    if inputs.steps is not None and inputs.steps != len(inputs.grads):  # type: ignore[arg-type]
        raise ValueError(f"inputs.steps = {inputs.steps} but inputs.grads has {len(inputs.grads)} tables")  # type: ignore[arg-type]
    return len(inputs.grads)  # type: ignore[arg-type]


def check_case(case: Case) -> None:
    n = _updates(case.inputs)
    exp = case.expected
    if len(exp.params) != n:
        raise ValueError(f"expected.params has {len(exp.params)} entries for {n} updates")
    if exp.state is not None and len(exp.state) != n:
        raise ValueError(f"expected.state has {len(exp.state)} entries for {n} updates")
    if exp.ema is not None and (len(exp.ema) != n or "ema" not in case.sections or not case.sections["ema"].enabled):
        raise ValueError(f"expected.ema needs an [ema] table with a decay and one entry per update ({n})")
    shapes = {k: v.shape for k, v in case.inputs.params.items()}
    for i, table in enumerate(exp.params):
        for name, value in table.items():
            if name not in shapes:
                raise ValueError(f"expected.params[{i}].{name} is not one of inputs.params ({', '.join(shapes)})")
            if value.shape != shapes[name]:
                raise ValueError(f"expected.params[{i}].{name} has shape {value.shape}; the parameter has {shapes[name]}")
    a = arrays(case)
    check_trajectory_inputs(case.sections["optimizer"], a["params"], a["grads"], a["objective"], a["steps"], a["state"])


def arrays(case: Case) -> dict[str, Any]:
    """The case's inputs as float64 NumPy arrays rounded to the case dtype (same on every backend)."""
    inp = case.inputs

    def r(table: dict[str, Any]) -> dict[str, Any]:
        return {k: round_to(v.astype("float64"), case.dtype) for k, v in table.items()}

    objective = None
    if inp.objective is not None:
        objective = {"kind": inp.objective.kind, "center": r(inp.objective.center),
                     "curvature": r(inp.objective.curvature)}
    state = None
    if inp.state is not None:
        state = {k: {n: (v if n == "step" else round_to(v.astype("float64"), case.dtype)) for n, v in e.items()}
                 for k, e in inp.state.items()}
    return {
        "params": r(inp.params),
        "grads": None if inp.grads is None else [r(g) for g in inp.grads],
        "objective": objective,
        "steps": inp.steps,
        "state": state,
    }


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("optimizers", "run_trajectory")
    extra = {"ema": case.sections["ema"]} if case.expected.ema is not None else {}
    out = fn(case.sections["optimizer"], dtype=case.dtype, **arrays(case), **extra)
    if "ema" in extra:  # not started yet: an empty table, as the case writes it
        out["ema"] = [e or {} for e in out["ema"]]
    return {k: out[k] for k in expected_values(case)}


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    values: dict[str, Any] = {"params": exp.params}
    if exp.state is not None:
        values["state"] = exp.state
    if exp.ema is not None:
        values["ema"] = exp.ema
    return values
