"""The building blocks of ref_jax's per-parameter optimizer math (_elementwise, _matrix): torch's
kernel conventions written with jnp. `coef` casts a scalar to the tensor's dtype, `lerp` is torch's
two-formula lerp, `prepare` picks the working dtype (float32 for half-precision parameters) and
applies maximize, `decay` is L2 or decoupled weight decay (nothing for a group built with
weight_decay = 0), `float_count` an update count as a float
of the hyper-parameters' dtype, `zeros` / `cast_like` make and round states."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp


def coef(x: Any, like: Any) -> Any:
    # a scalar coefficient in the array's dtype (torch casts Python scalars to the tensor dtype)
    return jnp.asarray(x).astype(like.dtype)


def lerp(start: Any, end: Any, w: Any) -> Any:
    # torch's lerp: start + w·(end − start) for |w| < 0.5, else end + (w − 1)·(end − start), written
    # as torch's vectorised kernel does (base + coeff·diff) so that only one formula is evaluated
    w = jnp.asarray(w)
    small = jnp.abs(w) < 0.5
    diff = end - start
    return jnp.where(small, start, end) + coef(jnp.where(small, w, w - 1), start) * diff


def prepare(g: Any, p: Any, cfg: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    work = jnp.float32 if p.dtype in (jnp.bfloat16, jnp.float16) else p.dtype
    g = g.astype(work)
    return (-g if cfg.get("maximize") else g), p.astype(work), work


def decay(g: Any, p: Any, hp: Mapping[str, Any], cfg: Mapping[str, Any], decoupled: bool) -> tuple[Any, Any]:
    if not cfg.get("decay_on", True):  # built with weight_decay = 0: no work (rebuilt when switched on)
        return g, p
    if decoupled:
        return g, p * coef(1 - hp["lr"] * hp["weight_decay"], p)
    return g + coef(hp["weight_decay"], p) * p, p


def float_count(step: Any, hp: Mapping[str, Any]) -> Any:
    return step.astype(hp["lr"].dtype)  # update counts as floats of the hyper-parameter dtype


def zeros(p: Any) -> Any:
    return jnp.zeros(p.shape, p.dtype)


def cast_like(s: Any, like: Any) -> Any:
    return jax.tree.map(lambda new, old: new.astype(old.dtype), s, like)
