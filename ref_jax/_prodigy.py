"""Prodigy (Mishchenko & Defazio 2024, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner")
as prodigyopt 1.1.2's Prodigy computes it: Adam whose step size d·lr comes from one estimate d of
the distance to the solution, shared by every parameter, so that an update reads all parameters
before it moves any. The shared d, d_max, d_numerator and k sit in every parameter's state, all
equal, read from the first parameter that has been updated. Equations: conformance/oracle/prodigy.py.
"""

# JAX: the whole tree at once (ref_jax._assembly.apply hands a Prodigy plan here): the sums over
# parameters are traced scalars, the early return (Σ|s| = 0) a select, so one program serves every
# update. The shared scalars are computed in the hyper-parameters' dtype.

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp

from ref_jax._kernels import coef, prepare, zeros

SHARED = ("d", "d_max", "d_numerator", "k")  # one value for the whole optimizer


class ProdigyState(NamedTuple):
    step: Any
    m: Any  # None when beta1 = 0 (prodigyopt keeps no exp_avg then)
    v: Any
    s: Any
    p0: Any
    d: Any
    d_max: Any
    d_numerator: Any
    k: Any


def init(p: Any, cfg: Mapping[str, Any]) -> ProdigyState:
    scalar = jnp.float64 if p.dtype == jnp.float64 else jnp.float32
    d0 = jnp.asarray(cfg["d0"], scalar)
    zero = jnp.zeros([], scalar)
    return ProdigyState(jnp.zeros([], jnp.int32), zeros(p) if cfg["first_moment"] else None, zeros(p), zeros(p),
                        jnp.array(p, copy=True), d0, d0, zero, zero)


def shared_values(states: Any, cfg: Mapping[str, Any], place: Any) -> dict[str, Any]:
    """d, d_max, d_numerator and k: from the first of `states` (the parameters' states, in order)
    that holds them, else their start (float64 on torch's device `place`; JAX: of dtype `place`)."""
    values = {"d": cfg["d0"], "d_max": cfg["d0"], "d_numerator": 0.0, "k": 0.0}
    out = {key: jnp.asarray(v, place) for key, v in values.items()}
    for leaf in reversed(list(states.values())):
        held = leaf.step > 0
        out = {key: jnp.where(held, getattr(leaf, key).astype(place), out[key]) for key in SHARED}
    return out


def apply(grads: Mapping[str, Any], leaves: Mapping[str, ProdigyState], params: Mapping[str, Any],
          hyperparams: tuple[Mapping[str, Any], ...], group_of: Mapping[str, int], cfg: Mapping[str, Any],
          present: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, ProdigyState]]:
    """One update of every parameter in `leaves`: ({name: update to add}, {name: new state}).
    `cfg` is the optimizer's static configuration (one for all groups), `group_of` each
    parameter's group, `present[name]` False a parameter without a gradient."""
    hp0 = hyperparams[0]
    dt = hp0["lr"].dtype
    b1, b2 = (b.astype(dt) for b in hp0["betas"])
    b3, d0 = hp0["beta3"].astype(dt), jnp.asarray(cfg["d0"], dt)
    sh = shared_values(leaves, cfg, dt)
    d, k = sh["d"], sh["k"]
    lr = jnp.max(jnp.stack([h["lr"].astype(dt) for h in hyperparams]))
    bc = jnp.sqrt(1 - b2 ** (k + 1)) / (1 - b1 ** (k + 1)) if cfg["use_bias_correction"] else 1.0
    dlr = d * lr * bc
    rate = (d / d0) * (d if cfg["safeguard_warmup"] else dlr)
    numerator, denominator, work = jnp.zeros([], dt), jnp.zeros([], dt), {}
    for name, leaf in leaves.items():
        hp = hyperparams[group_of[name]]
        g, p, _ = prepare(grads[name], params[name], cfg)
        if not cfg["decouple"]:  # a weight_decay of 0 adds 0·p: exact, so no group needs a flag
            g = g + coef(hp["weight_decay"], p) * p
        has = jnp.asarray(True) if present is None or name not in present else jnp.asarray(present[name])
        active = has & (hp["lr"] > 0)  # prodigyopt moves no sum or moment of a group whose lr is 0
        p0 = jnp.where(leaf.step == 0, p, leaf.p0.astype(p.dtype))  # the parameter at its first update
        dot = jnp.vdot(g, p0 - p).astype(dt)
        # the moments and sums move before prodigyopt's early return, so `go` does not gate them
        m = None if leaf.m is None else jnp.where(active, leaf.m * coef(b1, g) + coef(d * (1 - b1), g) * g, leaf.m)
        v = jnp.where(active, leaf.v * coef(b2, g) + (coef(d * d * (1 - b2), g) * g) * g, leaf.v)
        s = jnp.where(active, leaf.s * coef(b3, g) + coef(rate, g) * g, leaf.s)
        numerator = numerator + jnp.where(active, (d / d0) * dlr * dot, 0)
        denominator = denominator + jnp.where(active, jnp.sum(jnp.abs(s)).astype(dt), 0)
        work[name] = (g, p, p0, has, m, v, s)
    go = denominator != 0  # prodigyopt returns early when Σ|s| = 0: the moments have moved, nothing else
    numerator = b3 * sh["d_numerator"] + numerator
    d_hat = cfg["d_coef"] * numerator / jnp.where(go, denominator, 1)
    new_d = jnp.where(d == d0, jnp.maximum(d, d_hat), d)
    d_max = jnp.maximum(sh["d_max"], d_hat)
    new_d = jnp.minimum(d_max, new_d * cfg["growth_rate"])
    shared = {"d": new_d, "d_max": d_max, "d_numerator": numerator, "k": k + 1}
    updates, out = {}, {}
    for name, leaf in leaves.items():
        hp = hyperparams[group_of[name]]
        g, p, p0, has, m, v, s = work[name]
        moved = has & go
        q = p
        if cfg["decouple"]:
            q = q + coef(-hp["weight_decay"] * dlr, q) * q
        denom = jnp.sqrt(v) + coef(new_d * hp["eps"], v)
        q = q + coef(-dlr, q) * (m / denom) if m is not None else q + coef(-dlr * new_d, q) * (g / denom)
        updates[name] = jnp.where(moved, q - p, 0).astype(params[name].dtype)
        keep = {key: jnp.where(go, value, getattr(leaf, key).astype(dt)).astype(leaf.d.dtype)
                for key, value in shared.items()}
        out[name] = ProdigyState(
            jnp.where(moved, leaf.step + 1, leaf.step),
            None if m is None else m.astype(leaf.m.dtype), v.astype(leaf.v.dtype), s.astype(leaf.s.dtype),
            jnp.where(moved, p0, leaf.p0).astype(leaf.p0.dtype), **keep)
    return updates, out
