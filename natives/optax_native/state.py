"""optax's optimizer state under the neutral names of docs/contract.md §4, and back: a renaming of the
fields of optax's state tuples (ScaleByAdamState.mu → m, nu → v, ...), count → step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from natives._protocol import refuse
from natives.optax_native.backend import to_numpy


def field_names(optimizer: str, amsgrad_variant: str = "torch") -> dict[str, dict[str, str]]:
    """optax state class → {field: neutral name} for one optimizer."""
    second = "u" if optimizer == "adamax" else "v"
    if optimizer.startswith("schedule_free"):
        return {"ScheduleFreeState": {"z": "z"}, "ScaleByRmsWithCountState": {"nu": "v"}}
    return {
        "ScaleByAdamState": {"mu": "m", "nu": second},
        "ScaleByAmsgradState": {"mu": "m", "nu": "v",
                                "nu_max": "v_hat_max" if amsgrad_variant == "optax" else "v_max"},
        "TraceState": {"trace": "momentum_buffer"},
        "ScaleByRmsState": {"nu": "square_avg"},
        "ScaleByRStdDevState": {"mu": "grad_avg", "nu": "square_avg"},
        "ScaleByRssState": {"sum_of_squares": "sum"},
        "ScaleByLionState": {"mu": "m"},
        "ScaleByAdemamixState": {"m1": "m", "m2": "m_slow", "nu": "v"},
        "ProdigyState": {"exp_avg": "m", "exp_avg_sq": "v", "grad_sum": "s", "params0": "p0"},
    }


def _walk(node: Any, fn: Callable[[Any], Any]) -> Any:
    """`fn` applied to every state tuple of an optax state tree, rebuilt bottom-up."""
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        node = type(node)(*[_walk(getattr(node, f), fn) for f in node._fields])
        return fn(node)
    if isinstance(node, (tuple, list)):
        return type(node)(_walk(x, fn) for x in node)
    if isinstance(node, dict):
        return {k: _walk(v, fn) for k, v in node.items()}
    return node


def export(state: Any, names: Mapping[str, Mapping[str, str]], params: list[str],
           calls: int) -> dict[str, dict[str, Any]]:
    """{param: {neutral name: array, "step": optax's count}} from an optax state tree; `calls` (the
    update calls so far) where optax keeps no count (sgd)."""
    out: dict[str, dict[str, Any]] = {p: {} for p in params}
    counts: list[int] = []

    def visit(node: Any) -> Any:
        if "count" in node._fields and np.ndim(node.count) == 0:
            counts.append(int(node.count))
        if type(node).__name__ == "ScheduleFreeState":  # its averaging weights, one pair for the tree
            for param in node.z:
                out.setdefault(param, {}).update(weight_sum=to_numpy(node.weight_sum), lr_max=to_numpy(node.max_lr))
        if type(node).__name__ == "ProdigyState":  # one d for the tree; uncapped, prodigyopt's d is its d_max
            shared = {"d": to_numpy(node.estim_lr), "d_max": to_numpy(node.estim_lr),
                      "d_numerator": to_numpy(node.numerator_weighted), "k": np.asarray(float(node.count))}
            for param in node.exp_avg:
                out.setdefault(param, {}).update(shared)
        for field, neutral in names.get(type(node).__name__, {}).items():
            for param, value in getattr(node, field).items():
                if isinstance(value, jax.Array):
                    out.setdefault(param, {})[neutral] = to_numpy(value)
        return node

    _walk(state, visit)
    return {p: {**e, "step": max(counts) if counts else calls} for p, e in out.items()}


def load(state: Any, names: Mapping[str, Mapping[str, str]], neutral: Mapping[str, Mapping[str, Any]],
         dtype: Any) -> Any:
    """An optax state tree with the neutral start state written into its fields (one count: every
    parameter must have the same step)."""
    steps = {int(e["step"]) for e in neutral.values()}
    if len(steps) > 1:
        raise refuse("a start state with different steps per parameter", "optax keeps one count")
    step = steps.pop() if steps else None

    def visit(node: Any) -> Any:
        repl: dict[str, Any] = {}
        if "count" in node._fields and step is not None and np.ndim(node.count) == 0:
            repl["count"] = jnp.asarray(step, node.count.dtype)
            if "count_m2" in node._fields:  # optax.contrib.ademamix's count of its b3/alpha schedules
                repl["count_m2"] = jnp.asarray(step, node.count_m2.dtype)
        if type(node).__name__ == "ProdigyState" and neutral:  # its shared d and numerator, from any entry
            entry = next(iter(neutral.values()))
            repl.update(estim_lr=jnp.asarray(float(entry["d"]), node.estim_lr.dtype),
                        numerator_weighted=jnp.asarray(float(entry["d_numerator"]), node.numerator_weighted.dtype))
        for field, name in names.get(type(node).__name__, {}).items():
            tree = dict(getattr(node, field))
            for param, entries in neutral.items():
                if name in entries and isinstance(tree.get(param), jax.Array):
                    tree[param] = jnp.asarray(np.asarray(entries[name], np.float64), dtype)
            repl[field] = tree
        return node._replace(**repl) if repl else node

    return _walk(state, visit)
