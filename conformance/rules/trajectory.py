"""Inputs of an optimizer trajectory (the `optimizer` case kind's run_trajectory): host-side checks
that give the same InputError / ConfigError on every backend, and the quadratic objective
L = Σ curvature/2 · (p − center)² whose gradient drives a trajectory without a model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.config.optimizer import OptimizerSpec
from conformance.errors import InputError
from conformance.rules.groups import resolve_groups
from conformance.rules.state import check_state


def _check_array(where: str, x: Any, shape: Sequence[int] | None = None) -> None:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise InputError(f"{where} must be a numeric array; received {arr.dtype}")
    if shape is not None and arr.shape != tuple(shape):
        raise InputError(f"{where} has shape {arr.shape}; the parameter has shape {tuple(shape)}")
    if not np.all(np.isfinite(arr.astype(np.float64))):
        raise InputError(f"{where} contains a non-finite value")


def check_trajectory_inputs(spec: OptimizerSpec, params: Mapping[str, Any], grads: Any, objective: Any,
                            steps: Any, state: Any) -> int:
    """Validate a run_trajectory call on the host (same InputError / ConfigError on every backend);
    return the number of updates."""
    if not isinstance(params, Mapping) or not params:
        raise InputError("params must be a non-empty table of parameter name -> array")
    shapes = {k: np.shape(v) for k, v in params.items()}
    for name, value in params.items():
        _check_array(f"params[{name!r}]", value)
    if (grads is None) == (objective is None):
        raise InputError("give either grads (one table per update) or objective with steps, not both")
    if grads is not None:
        if steps is not None and steps != len(grads):
            raise InputError(f"steps = {steps} does not match the {len(grads)} gradient tables")
        for k, table in enumerate(grads):
            for name, g in table.items():
                if name not in shapes:
                    raise InputError(f"grads[{k}] names parameter {name!r}, which params does not have")
                _check_array(f"grads[{k}][{name!r}]", g, shapes[name])
        n = len(grads)
    else:
        if objective.get("kind", "quadratic") != "quadratic":
            raise InputError(f"objective.kind must be 'quadratic'; received {objective.get('kind')!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise InputError(f"steps must be an integer >= 0 with an objective; received {steps!r}")
        for part in ("center", "curvature"):
            table = objective.get(part)
            if not isinstance(table, Mapping) or set(table) != set(shapes):
                raise InputError(f"objective.{part} must give every parameter ({', '.join(shapes)})")
            for name, x in table.items():
                _check_array(f"objective.{part}[{name!r}]", x)
                if np.broadcast_shapes(np.shape(x), shapes[name]) != shapes[name]:
                    raise InputError(f"objective.{part}[{name!r}] of shape {np.shape(x)} does not broadcast "
                                     f"to the parameter's shape {shapes[name]}")
        n = steps
    groups = resolve_groups(spec, shapes)
    if state:
        check_state(groups, shapes, state)
    return n


def objective_grads(objective: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Gradient of L = Σ curvature/2 · (p − center)² at `params` (any array type with arithmetic)."""
    center, curvature = objective["center"], objective["curvature"]
    return {k: curvature[k] * (p - center[k]) for k, p in params.items()}
