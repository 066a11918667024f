"""How an optimizer spec becomes the framework's optimizer: each parameter group
(conformance.rules.groups.resolve_groups, in that order) in the form the framework's optimizer
takes it (`group_options`), and one optimizer over all the groups (`make`). Zero-size parameters are
not given to the optimizer: they have nothing to update, and torch's Adafactor divides by their size.
"""

# JAX: one optax transform with per-parameter states and per-group hyper-parameters over a {name: array} dict.
#
# `make(spec, params)` returns an `optax.GradientTransformationExtraArgs`. Its state is an
# `OptimizerState` NamedTuple:
#
# - `plan` (static pytree node, no leaves): parameter names, their groups and each group's static
#   configuration, so that a state can be exported, imported and jitted on its own;
# - `hyperparams`: one dict per parameter group of the float hyper-parameters torch lets you change
#   between steps (`lr`, `momentum`, `betas`, `eps`, ...), as arrays: changing them (schedules,
#   OneCycle's momentum) never recompiles;
# - `leaves`: one state per parameter (ref_jax._elementwise), with its own update count, as torch keeps.
#
# This is optax.multi_transform with one label per parameter and hyper-parameters shared per group
# (injected, as optax.inject_hyperparams does), written out so that a parameter without a gradient
# (`present[name]` False) keeps its state and count, as torch does for `p.grad is None`.

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from conformance.config.optimizer import DYNAMIC, OptimizerSpec
from conformance.errors import ConfigError
from conformance.rules.groups import ParamGroup, resolve_groups
from ref_jax import _elementwise, _prodigy


@jax.tree_util.register_static
@dataclass(frozen=True)
class Plan:
    """Static layout of an optimizer: which parameter belongs to which group, and each group's
    optimizer with its static (non-float) options."""

    names: tuple[str, ...]  # parameters the optimizer updates (zero-size ones excluded)
    group_index: tuple[int, ...]  # group of each name
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    optimizers: tuple[str, ...]  # per group
    labels: tuple[str, ...]  # per group
    static: tuple[tuple[tuple[str, Any], ...], ...]  # per group: sorted (key, value) pairs

    def cfg(self, group: int) -> dict[str, Any]:
        return dict(self.static[group])


class OptimizerState(NamedTuple):
    plan: Plan
    hyperparams: tuple[dict[str, Any], ...]
    leaves: dict[str, Any]


def group_options(group: ParamGroup) -> tuple[dict[str, Any], dict[str, Any]]:
    """A parameter group's hyper-parameters in the form the framework's optimizer takes them (torch:
    the constructor's keyword arguments, twinstep's extra fields kept for its own classes; JAX:
    (dynamic, static), the settable floats and the static options with those derived from them)."""
    hp = dict(group.hyperparams)
    name = group.optimizer
    dynamic = {k: v for k, v in hp.items() if k in DYNAMIC and not (name == "adafactor" and k == "eps")}
    static = {k: v for k, v in hp.items() if k not in dynamic}
    if name == "adafactor":
        static["eps1"], dynamic["eps"] = hp["eps"]
        del static["eps"]
    static["decoupled"] = name == "adamw" or bool(hp.get("decoupled_weight_decay", False))
    static.setdefault("eps_root", 0.0)
    static.setdefault("eps_hat", False)
    # decided at build time (no work, no buffer for what is off); set_hyperparams rebuilds when switched on
    if name in ("rmsprop", "sgd"):
        static["momentum_on"] = hp["momentum"] != 0
    if "weight_decay" in hp:
        static["decay_on"] = hp["weight_decay"] != 0
    if name == "prodigy":
        static["first_moment"] = hp["betas"][0] > 0  # prodigyopt keeps no exp_avg at beta1 = 0
    return dynamic, static


def _array(value: Any, like: Any = None) -> Any:
    if isinstance(value, (tuple, list)):
        return tuple(_array(v, None if like is None else like[i]) for i, v in enumerate(value))
    return jnp.asarray(value, like.dtype if like is not None else jnp.result_type(float))


def make(spec: OptimizerSpec, params: Mapping[str, Any]) -> tuple[optax.GradientTransformationExtraArgs, Plan]:
    """The optimizer of `spec` over the named parameters (torch: a torch.optim.Optimizer whose
    param_groups carry `param_names`, `impl` choosing its kernels: "auto", "default", "single",
    "foreach" or "fused"; JAX: the optax transform over a {name: array} dict and its static Plan)."""
    shapes = {k: tuple(jnp.shape(v)) for k, v in params.items()}
    groups = resolve_groups(spec, shapes)
    index = {n: i for i, g in enumerate(groups) for n in g.names}
    names = tuple(n for n in params if n in index and int(jnp.size(params[n])) > 0)
    parts = [group_options(g) for g in groups]
    plan = Plan(
        names=names,
        group_index=tuple(index[n] for n in names),
        shapes=tuple(shapes[n] for n in names),
        dtypes=tuple(str(getattr(params[n], "dtype", None) or jnp.result_type(params[n])) for n in names),
        optimizers=tuple(g.optimizer for g in groups),
        labels=tuple(g.label for g in groups),
        static=tuple(tuple(sorted(s.items())) for _, s in parts),
    )
    initial = tuple(d for d, _ in parts)

    def init(params: Mapping[str, Any]) -> OptimizerState:
        return fresh_state(plan, initial, params)

    def update(grads: Mapping[str, Any], state: OptimizerState, params: Mapping[str, Any] | None = None,
               present: Mapping[str, Any] | None = None, **extra: Any) -> tuple[dict[str, Any], OptimizerState]:
        del extra
        if params is None:
            raise ValueError("this optimizer needs params in update(grads, state, params)")
        return apply(grads, state, params, present)

    return optax.GradientTransformationExtraArgs(init, update), plan


def fresh_state(plan: Plan, hyperparams: tuple[dict[str, Any], ...],
                params: Mapping[str, Any] | None = None) -> OptimizerState:
    """The state before any update, with the given per-group hyper-parameters (state dtypes: those
    of `params` when given, else the plan's). Schedule-free states start z at the given `params`
    (torch makes it at the first update, from the parameter then: the same in every use here)."""
    leaves = {}
    for name, gi, shape, dtype in zip(plan.names, plan.group_index, plan.shapes, plan.dtypes):
        like = jnp.asarray(params[name]) if params is not None else jnp.zeros(shape, dtype)
        init = _prodigy.init if plan.optimizers[gi] == "prodigy" else _elementwise.LEAVES[plan.optimizers[gi]][0]
        leaves[name] = init(like, plan.cfg(gi))
    return OptimizerState(plan, tuple({k: _array(v) for k, v in h.items()} for h in hyperparams), leaves)


def apply(grads: Mapping[str, Any], state: OptimizerState, params: Mapping[str, Any],
          present: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], OptimizerState]:
    """One update: (updates to add to params, new state). `present[name]` False: no gradient."""
    plan = state.plan
    leaves = dict(state.leaves)
    updates = {k: jnp.zeros_like(v) for k, v in params.items()}
    if plan.optimizers and plan.optimizers[0] == "prodigy":  # one d for every parameter: all at once
        moved, new = _prodigy.apply(grads, {n: leaves[n] for n in plan.names}, params, state.hyperparams,
                                    dict(zip(plan.names, plan.group_index)), plan.cfg(0), present)
        return {**updates, **moved}, OptimizerState(plan, state.hyperparams, {**leaves, **new})
    for name, gi in zip(plan.names, plan.group_index):
        p, s = params[name], state.leaves[name]
        cfg = {**plan.cfg(gi), "param_dtype": p.dtype}

        def step(g: Any, s: Any = s, p: Any = p, gi: int = gi, cfg: dict = cfg) -> tuple[Any, Any]:
            hp = state.hyperparams[gi]
            if cfg.get("cautious_weight_decay") and cfg.get("decay_on", True):
                return cautious_weight_decay(plan.optimizers[gi], g, s, p, hp, cfg)
            new_p, new_s = _elementwise.update(plan.optimizers[gi], g, s, p, hp, cfg)
            if isinstance(new_p, _elementwise.Delta):
                return new_p.u, new_s  # torch's kernel is p + u: the same two operations
            return new_p - p, new_s  # p + (new_p - p) == new_p exactly when new_p/p is in [1/2, 2] (Sterbenz)

        if present is not None and name in present:
            # no gradient: no update and the state (count included) untouched; skipped, not computed
            u, new_s = jax.lax.cond(jnp.asarray(present[name]), step,
                                    lambda g, s=s, p=p: (jnp.zeros_like(p), s), grads[name])
        else:
            u, new_s = step(grads[name])
        updates[name] = u
        leaves[name] = new_s
    return updates, OptimizerState(plan, state.hyperparams, leaves)


def _check_rmsprop_buffers(state: OptimizerState, group: int, momentum: Any) -> None:
    # torch.optim.RMSprop has no buffer for a parameter first updated without momentum, and fails
    # if momentum is switched on later; the same ConfigError here (checked where values are concrete)
    leaves = [state.leaves[n] for n, g in zip(state.plan.names, state.plan.group_index) if g == group]
    if any(isinstance(x, jax.core.Tracer) for x in [momentum, *(v for s in leaves for v in (s.step, s.initialized))]):
        return
    if float(momentum) > 0 and any(int(s.step) > 0 and not bool(s.initialized) for s in leaves):
        raise ConfigError(f"group {group}: rmsprop parameters updated without momentum keep no momentum "
                          f"buffer (torch.optim.RMSprop); set momentum > 0 before the first update")


SWITCHES = {"momentum": "momentum_on", "weight_decay": "decay_on"}  # hyper-parameter -> static flag


def _switch_on(state: OptimizerState, group: int, key: str, value: Any) -> OptimizerState:
    """A group built with weight_decay = 0 does no decay work, an rmsprop group built without
    momentum carries no buffer (the plain step is as cheap as optax.rmsprop's): setting the value
    non-zero rebuilds the group's plan (and adds the zero buffers). A traced value (inside jit) may
    be non-zero: rebuilt too (the full path then follows torch for any value)."""
    plan, flag = state.plan, SWITCHES.get(key)
    if flag is None or plan.cfg(group).get(flag, True):
        return state
    if not isinstance(value, jax.core.Tracer) and float(value) == 0:
        return state
    static = list(plan.static)
    static[group] = tuple(sorted({**plan.cfg(group), flag: True}.items()))
    new_plan = Plan(plan.names, plan.group_index, plan.shapes, plan.dtypes, plan.optimizers, plan.labels,
                    tuple(static))
    leaves = dict(state.leaves)
    if flag == "momentum_on":  # zero buffers, not yet initialized: torch makes them at the next update
        for name, gi, shape, dtype in zip(plan.names, plan.group_index, plan.shapes, plan.dtypes):
            if gi == group:
                leaves[name] = leaves[name]._replace(momentum_buffer=jnp.zeros(shape, dtype))
    return OptimizerState(new_plan, state.hyperparams, leaves)


def set_hyperparams(state: OptimizerState, group: int, values: Mapping[str, Any]) -> OptimizerState:
    """A copy of `state` with group `group`'s dynamic hyper-parameters replaced (jittable)."""
    plan = state.plan
    if not 0 <= group < len(state.hyperparams):
        raise ConfigError(f"group {group} does not exist; the optimizer has {len(state.hyperparams)} groups")
    current = dict(state.hyperparams[group])
    for key, value in values.items():
        if key not in current:
            raise ConfigError(f"group {group} ({plan.labels[group]}, {plan.optimizers[group]}) has no settable "
                              f"hyper-parameter {key!r}; settable: {', '.join(current)}")
        if plan.optimizers[group] == "adafactor" and key == "eps":
            value = value[1] if isinstance(value, (tuple, list)) else value
        if key == "momentum" and plan.optimizers[group] == "rmsprop":
            _check_rmsprop_buffers(state, group, value)
        state = _switch_on(state, group, key, value)
        current[key] = _array(value, current[key])
    hps = list(state.hyperparams)
    hps[group] = current
    return OptimizerState(state.plan, tuple(hps), state.leaves)


def cautious_weight_decay(name: str, g: Any, s: Any, p: Any, hp: Mapping[str, Any],
                          cfg: Mapping[str, Any]) -> tuple[Any, Any]:
    """Cautious weight decay for the groups that set it: the step runs without its decoupled decay,
    then p ← p − lr·wd·p₀·[(p₀ − p)·p₀ ≥ 0] with p₀ the parameter before the step (the decay only
    where the step moved it toward zero; heavyball's cautious_weight_decay, nanochat's Muon)."""
    # returns (the update to add to p, the new state), as apply's step does
    moved, new_s = _elementwise.update(name, g, s, p, {**hp, "weight_decay": jnp.zeros_like(hp["weight_decay"])}, cfg)
    moved = p + moved.u if isinstance(moved, _elementwise.Delta) else moved
    mask = ((p - moved) * p >= 0).astype(p.dtype)
    rate = (hp["lr"] * hp["weight_decay"]).astype(p.dtype)
    return (moved - rate * (p * mask)) - p, new_s

