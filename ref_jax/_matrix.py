"""Adafactor and Muon for ref_jax: torch's factored second moment (last two axes) and torch's
Muon (momentum, Newton–Schulz orthogonalisation, shape-adjusted lr), one parameter at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ref_jax._kernels import coef, float_count, lerp, prepare, zeros
from ref_jax._muon import newton_schulz


class AdafactorState(NamedTuple):
    step: Any
    row_var: Any
    col_var: Any
    variance: Any


class MuonState(NamedTuple):
    step: Any
    momentum_buffer: Any



# ------------------------------------------------------------------ adafactor


def adafactor_init(p: Any, cfg: Mapping[str, Any]) -> AdafactorState:
    step = jnp.zeros([], jnp.int32)
    if p.ndim > 1:
        row = jnp.zeros(p.shape[:-1] + (1,), p.dtype)
        col = jnp.zeros(p.shape[:-2] + (1,) + p.shape[-1:], p.dtype)
        return AdafactorState(step, row, col, None)
    return AdafactorState(step, None, None, zeros(p))


def _norm(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=keepdims))


def adafactor_update(g, s: AdafactorState, p, hp, cfg):
    g, p, work = prepare(g, p, cfg)
    eps1 = cfg["eps1"]
    eps1 = float(jnp.finfo(cfg["param_dtype"]).eps) if eps1 == "auto" else eps1
    t = s.step + 1
    tf = float_count(t, hp)
    c = tf ** hp["beta2_decay"]
    rho = jnp.minimum(hp["lr"], 1 / tf ** 0.5)
    rms_p = _norm(p).astype(tf.dtype) / p.size ** 0.5
    alpha = jnp.maximum(hp["eps"], rms_p) * rho
    p = p * coef(1 - hp["lr"] * hp["weight_decay"], p)
    if g.ndim > 1:
        row = lerp(s.row_var, jnp.square(_norm(g, -1, True)) / g.shape[-1], c)
        col = lerp(s.col_var, jnp.square(_norm(g, -2, True)) / g.shape[-2], c)
        var = jnp.matmul(row, col, precision=jax.lax.Precision.HIGHEST)
        var = var / jnp.maximum(jnp.mean(row, axis=-2, keepdims=True), coef(eps1, row))
        new = AdafactorState(t, row, col, None)
    else:
        variance = lerp(s.variance, g * g, c)
        var = variance
        new = AdafactorState(t, None, None, variance)
    u = jax.lax.rsqrt(jnp.maximum(var, coef(eps1 * eps1, var))) * g
    denom = jnp.maximum(1.0, _norm(u).astype(tf.dtype) / (u.size ** 0.5 * hp["d"]))
    return p + coef(-alpha / denom, p) * u, new


# ------------------------------------------------------------------ muon


def muon_init(p: Any, cfg: Mapping[str, Any]) -> MuonState:
    return MuonState(jnp.zeros([], jnp.int32), zeros(p))


def muon_update(g, s: MuonState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    mu = hp["momentum"]
    buf = lerp(s.momentum_buffer, g, 1 - mu)
    x = lerp(g, buf, mu) if cfg["nesterov"] else buf
    o = newton_schulz(x, cfg["ns_coefficients"], cfg["ns_steps"], hp["eps"], cfg["ns_dtype"])
    rows, cols = p.shape
    if cfg["adjust_lr_fn"] == "original":
        ratio = max(1.0, rows / cols) ** 0.5 if cols else 1.0
    else:
        ratio = 0.2 * max(rows, cols) ** 0.5
    p = p * coef(1 - hp["lr"] * hp["weight_decay"], p)
    return p + coef(-(hp["lr"] * ratio), p) * o.astype(p.dtype), MuonState(s.step + 1, buf)
