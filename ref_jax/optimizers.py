"""Optimizers with torch.optim's semantics, parameter groups and a neutral state (torch: on
torch.optim; JAX: on optax).

Trainers build the optimizer from the spec and the named parameters (the names of torch's
`named_parameters()`, e.g. `0.weight`), read and set per-group hyper-parameters before every
update (schedules set `lr`; OneCycle cycles `momentum` or `betas[0]`), and move the state between
frameworks through the neutral format of docs/contract.md §4:

    {"step": n, "state": {param_name: {state_name: ndarray}}}

`step` is the number of updates applied (the largest per-parameter count); every parameter that
has been updated has an entry with its own `step` (conformance.rules.state.state_shapes lists the
names). Counting: update t uses the hyper-parameters set for t; bias corrections count the
updates a parameter received. Nothing advances outside `step()` / `update()`: a skipped update
(not calling them, or keeping the old state) leaves everything as it was.

Torch: `state` below is the torch.optim.Optimizer itself. JAX: `state` is the optimizer state (an
`OptimizerState` NamedTuple pytree), and `update(grads, state, params, present=None)` returns
(updates, state) as optax does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from conformance.config.ema import EmaSpec
from conformance.config.optimizer import SCHEDULE_FREE, OptimizerSpec
from conformance.errors import InputError
from conformance.rules.ema import ema_due
from conformance.rules.groups import ParamGroup
from conformance.rules.state import check_state
from conformance.rules.trajectory import check_trajectory_inputs, objective_grads
from ref_jax import _assembly, _elementwise, _schedule_free
from ref_jax.backend import framework_dtype, to_numpy
from ref_jax.ema import export_ema, init_ema, update_ema

__all__ = [
    "build_optimizer", "export_state", "group_hyperparams", "import_state", "run_trajectory",
    "set_group_hyperparams", "to_eval_point", "to_train_point",
]


def build_optimizer(spec: OptimizerSpec, named_params: Any) -> Any:
    """Build the optimizer of `spec` for the named parameters (torch: an iterable of (name,
    parameter), e.g. model.named_parameters(); JAX: the {name: array} parameter dict). Groups come
    from conformance.rules.groups.resolve_groups, in that order. Torch: a torch.optim.Optimizer (the
    built-in class, with foreach/fused kernels on CUDA, or a twinstep class where torch has none)
    whose param_groups carry `param_names`. JAX: an optax GradientTransformationExtraArgs over the
    dict, `update(grads, state, params, present=None)`, where present[name] = False marks a
    parameter without a gradient in this update (not updated, state untouched, as torch does for
    `grad is None`). Zero-size parameters are left out of the optimizer on both sides."""
    tx, _ = _assembly.make(spec, dict(named_params))
    return tx


def group_hyperparams(state: Any) -> list[dict[str, Any]]:
    """The hyper-parameters of every parameter group, in group order (torch vocabulary: lr,
    momentum, betas, ...). Torch: all of param_groups[i] but `params`; JAX: the settable floats."""
    return [dict(h) for h in state.hyperparams]


def set_group_hyperparams(state: Any, group: int, **values: Any) -> Any:
    """Set hyper-parameters of parameter group `group` for the next update, e.g. lr=1e-3 or
    betas=(0.85, 0.999). Torch: changes optimizer.param_groups[group] in place and returns the
    optimizer; JAX: returns a new state (jittable, no recompilation). Unknown names raise
    ConfigError."""
    return _assembly.set_hyperparams(state, group, values)


def _groups(state: _assembly.OptimizerState) -> list[ParamGroup]:
    plan = state.plan
    out = []
    for gi, opt in enumerate(plan.optimizers):
        hp = {**plan.cfg(gi), **{k: _py(v) for k, v in state.hyperparams[gi].items()}}
        names = tuple(n for n, g in zip(plan.names, plan.group_index) if g == gi)
        out.append(ParamGroup(plan.labels[gi], opt, hp, None, names=names))
    return out


def _py(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_py(v) for v in value)
    return float(value)


def export_state(state: Any) -> dict[str, Any]:
    """The optimizer state in the neutral format {"step": n, "state": {param: {name: ndarray}}}
    (arrays in their own dtype; `step` entries int64). Parameters never updated have no entry."""
    plan = state.plan
    out: dict[str, dict[str, np.ndarray]] = {}
    for name in plan.names:
        leaf = state.leaves[name]
        step = int(leaf.step)
        if step == 0:
            continue
        entry: dict[str, np.ndarray] = {}
        for field, value in zip(leaf._fields, leaf):
            if value is None or field in _elementwise.INTERNAL_FIELDS:
                continue
            if field == "momentum_buffer" and not bool(getattr(leaf, "initialized", True)):
                continue  # sgd / rmsprop: torch has created no buffer
            entry[field] = np.asarray(step, np.int64) if field == "step" else np.asarray(jax.device_get(value))
        out[name] = entry
    return {"step": max((int(e["step"]) for e in out.values()), default=0), "state": out}


def import_state(state: Any, neutral: Mapping[str, Any]) -> Any:
    """Load a neutral state ({"step": n, "state": {...}}, as export_state writes) into an
    optimizer of the same spec and parameters. Torch: into the optimizer, in place, returned; JAX:
    a new state built on `state` (its hyper-parameters are kept). Parameters without an entry
    start afresh. Checked first: InputError names the parameter and the state entry."""
    plan = state.plan
    entries = _entries(neutral)
    check_state(_groups(state), dict(zip(plan.names, plan.shapes)), entries)
    leaves = dict(_assembly.fresh_state(plan, state.hyperparams).leaves)
    for name, leaf in state.leaves.items():  # fresh leaves of `state` (init from the parameters) stay
        if name not in entries and not isinstance(leaf.step, jax.core.Tracer) and int(leaf.step) == 0:
            leaves[name] = leaf
    for name, entry in entries.items():
        fresh = leaves[name]
        values = {}
        for field, cur in zip(fresh._fields, fresh):
            if field == "initialized":
                values[field] = jnp.asarray("momentum_buffer" in entry)
            elif cur is None or field not in entry:
                values[field] = cur
            elif field == "step":
                values[field] = jnp.asarray(int(np.asarray(entry[field])), jnp.int32)
            else:
                values[field] = jnp.asarray(np.asarray(entry[field])).astype(cur.dtype)
        leaves[name] = type(fresh)(**values)
    return _assembly.OptimizerState(plan, state.hyperparams, leaves)


def _entries(neutral: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    if not isinstance(neutral, Mapping) or "state" not in neutral or not isinstance(neutral["state"], Mapping):
        raise InputError("a neutral optimizer state is a table {'step': n, 'state': {param: {name: array}}}")
    return neutral["state"]


def _swap(state: Any, params: Any, train: bool) -> dict[str, Any]:
    plan = state.plan
    out = dict(params)
    for name, gi in zip(plan.names, plan.group_index):
        if plan.optimizers[gi] not in SCHEDULE_FREE:
            continue
        leaf, b = state.leaves[name], _schedule_free.beta(state.hyperparams[gi])
        moved = (_schedule_free.train_point if train else _schedule_free.eval_point)(params[name], leaf, b)
        out[name] = jnp.where(leaf.step > 0, moved.astype(params[name].dtype), params[name])
    return out


def to_eval_point(state: Any, params: Any) -> Any:
    """The parameters to evaluate and save. Schedule-free optimizers: the average
    x = lerp(y, z, 1 − 1/β) (schedulefree's optimizer.eval()); every other optimizer: the parameters
    as they are. Torch: `state` is the optimizer, its parameters move in place (once: it remembers
    being in eval mode) and `params` is returned; JAX: a new {name: array} dict from `params`."""
    return _swap(state, params, train=False)


def to_train_point(state: Any, params: Any) -> Any:
    """The parameters to take gradients at: schedule-free optimizers' y = lerp(x, z, 1 − β)
    (optimizer.train(); after to_eval_point it rounds, as the package's does); every other
    optimizer: the parameters as they are. Torch: in place (once), returns `params`; JAX: a new dict."""
    return _swap(state, params, train=True)


@jax.jit
def _step(params: Any, grads: Any, present: Any, state: Any) -> tuple[Any, Any]:
    updates, state = _assembly.apply(grads, state, params, present)
    return optax.apply_updates(params, updates), state


def run_trajectory(
    spec: OptimizerSpec,
    params: Mapping[str, np.ndarray],
    grads: list[Mapping[str, np.ndarray]] | None = None,
    objective: Mapping[str, Any] | None = None,
    steps: int | None = None,
    dtype: str = "float64",
    state: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ema: EmaSpec | None = None,
) -> dict[str, Any]:
    """Run `spec` on NumPy parameters: {"params": [after update 0, 1, ...], "state": [neutral
    state after each update], "ema": [the weights' EMA after each update, None before it starts]
    (with `ema`, an [ema] spec)}. Gradients are given per update (a parameter missing from an
    update's table has no gradient there) or come from `objective` (quadratic) for `steps`
    updates; `state` is a neutral state ({param: {name: array}}) to start from."""
    n = check_trajectory_inputs(spec, params, grads, objective, steps, state)
    dt = framework_dtype(dtype)
    p = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in params.items()}
    tx = build_optimizer(spec, p)
    st = tx.init(p)
    if state:
        st = import_state(st, {"state": state})
    if objective is not None:
        center = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in objective["center"].items()}
        curvature = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in objective["curvature"].items()}
    out_params, out_state, out_ema = [], [], []
    average = init_ema(ema, p) if ema is not None else None
    for k in range(n):
        if grads is not None:
            g = {name: jnp.asarray(np.asarray(grads[k].get(name, np.zeros(np.shape(v))), np.float64), dt)
                 for name, v in params.items()}
            present = {name: jnp.asarray(name in grads[k]) for name in params}
        else:
            g = objective_grads({"center": center, "curvature": curvature}, p)
            present = {name: jnp.asarray(True) for name in params}
        p, st = _step(p, g, present, st)
        out_params.append({name: to_numpy(v) for name, v in p.items()})
        out_state.append({name: {key: np.asarray(a, np.float64) for key, a in e.items()}
                          for name, e in export_state(st)["state"].items()})
        if average is not None:
            average = update_ema(ema, average, p, ema_due(ema, k))  # type: ignore[arg-type]
            out_ema.append(export_ema(average))
    return {"params": out_params, "state": out_state, "ema": out_ema}
