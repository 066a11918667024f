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
Calls `optimizers.run_trajectory(spec, params, grads, objective, steps, dtype, state)`.

With a `[schedule]` and/or `[clip]` table the case runs the trainer's update path instead:
`update.run_updates(config, params, windows)` with one micro-batch per update whose gradient is
that update's `grads` table, so update t applies the schedule's lr at t (docs/contract.md §2) and
the gradients are clipped before the step. Such a case gives `grads` for every parameter in every
update (no objective, no start `state`, no expected `state`; run_updates does not export it) and
its dtype is float64 or float32 (the run's precision.dtype).
"""

from __future__ import annotations

from typing import Any, Literal

from conformance.config import Config, PrecisionSpec
from conformance.config.base import NonNegInt
from conformance.errors import ConfigError
from conformance.harness.arrays import Array, CaseTable, ParamSet, round_to
from conformance.harness.backends import Backend, require_parameters
from conformance.harness.case import Case
from conformance.rules.schedules import check_schedule
from conformance.rules.trajectory import check_trajectory_inputs

REQUIRED_SECTIONS = ("optimizer",)
USED_SECTIONS = ("optimizer", "schedule", "clip", "ema")

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
    if through_update_path(case):
        _check_update_path(case, n)


def through_update_path(case: Case) -> bool:
    """A case with [schedule] or [clip] runs the trainer's update path (update.run_updates)."""
    return "schedule" in case.sections or "clip" in case.sections


def _check_update_path(case: Case, n: int) -> None:
    tables = " and ".join(f"[{t}]" for t in ("schedule", "clip") if t in case.sections)
    inp = case.inputs
    if inp.grads is None:
        raise ValueError(f"inputs.objective cannot be used with {tables}: the update path runs on given "
                         "gradients (inputs.grads, one table per update)")
    if inp.state is not None or case.expected.state is not None:
        key = "inputs.state" if inp.state is not None else "expected.state"
        raise ValueError(f"{key} cannot be used with {tables}: update.run_updates neither imports nor "
                         "exports optimizer state")
    if case.expected.ema is not None:
        raise ValueError(f"expected.ema cannot be used with {tables}: update.run_updates keeps no EMA")
    if case.dtype not in ("float64", "float32"):
        raise ValueError(f"dtype = {case.dtype!r} cannot be used with {tables}; use float64 or float32")
    for k, table in enumerate(inp.grads):
        missing = [name for name in inp.params if name not in table]
        if missing:
            raise ValueError(f"inputs.grads[{k}] has no gradient for {', '.join(missing)}; with {tables} "
                             "every parameter has a gradient in every update (as in training)")
    if n:
        try:
            check_schedule(update_config(case).schedule, case.sections["optimizer"], n)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


def update_config(case: Case) -> Config:
    """The training config of an update-path case: its tables, precision.dtype = the case dtype."""
    tables = {k: case.sections[k] for k in ("optimizer", "schedule", "clip") if k in case.sections}
    return Config(**tables, precision=PrecisionSpec(dtype=case.dtype))


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
    a = arrays(case)
    if not through_update_path(case):
        fn = backend.function("optimizers", "run_trajectory")
        # an error case's [expected] has no ema: it runs without one (the error comes first)
        extra = {"ema": case.sections["ema"]} if not case.expects_error and case.expected.ema is not None else {}
        require_parameters(backend.name, fn, "optimizers.run_trajectory", extra)
        out = fn(case.sections["optimizer"], dtype=case.dtype, **a, **extra)
        if "ema" in extra:  # not started yet: an empty table, as the case writes it
            out["ema"] = [e or {} for e in out["ema"]]
        return {k: out[k] for k in expected_values(case)}
    fn = backend.function("update", "run_updates")
    # the same host-side checks as run_trajectory, so an error case fails alike on every backend
    check_trajectory_inputs(case.sections["optimizer"], a["params"], a["grads"], None, a["steps"], None)
    windows = [[{"g": g, "count": 1.0, "poison": 1.0}] for g in a["grads"]]
    out = fn(update_config(case), a["params"], windows)
    return {"params": out["params"]}


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    values: dict[str, Any] = {"params": exp.params}
    if exp.state is not None:
        values["state"] = exp.state
    if exp.ema is not None:
        values["ema"] = exp.ema
    return values
