"""Gradient clipping in NumPy float64, from the equations (see conformance.config.clip).

With gradients g_k (one array per parameter) and p = norm_type:

    n_k = ‖g_k‖_p,   n = ‖(n_1, …, n_K)‖_p           (torch's get_total_norm: norms of norms)
    global norm, eps > 0:  g ← g · min(c / (n + eps), 1)
    global norm, eps = 0:  g ← g if n < c else (g / n) · c   (optax.clip_by_global_norm; g / n
                           is evaluated as g · (1 / n), as XLA rewrites a division by a scalar)
    per parameter:         the same with n_k in place of n, for each k
    by value:              g ← clamp(g, -v, v)

The returned `total_norm` is n before clipping. ‖x‖_inf = max |x_i|.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from conformance.config.clip import ClipSpec
from conformance.errors import InputError, NonFiniteError
from conformance.rules.inputs import first_nonfinite
from conformance.rules.nonfinite import nonfinite_norm_message


def vector_norm(x: np.ndarray, p: float) -> float:
    """‖x‖_p of a flattened array; NaN anywhere gives NaN (as torch.linalg.vector_norm)."""
    a = np.abs(np.asarray(x, np.float64).ravel())
    if a.size == 0:
        return 0.0
    if np.isnan(a).any():
        return math.nan
    if math.isinf(p):
        return float(a.max())
    if p == 1:
        return float(a.sum())
    if p == 2:
        return float(np.sqrt(np.sum(a * a)))
    return float(np.sum(a**p) ** (1.0 / p))


def total_norm(grads: Mapping[str, np.ndarray], p: float) -> float:
    """The norm of the per-parameter norms (the norm of all gradients as one vector)."""
    if not grads:
        return 0.0
    return vector_norm(np.array([vector_norm(g, p) for g in grads.values()]), p)


def _scale(g: np.ndarray, n: float, spec: ClipSpec) -> np.ndarray:
    c = spec.max_norm
    if spec.eps == 0:
        # XLA evaluates optax's g / n as g * (1 / n); the oracle mirrors it to stay bit-exact
        return g if n < c else (g * (1.0 / n)) * c
    return g * min(c / (n + spec.eps), 1.0)


def clip_and_norm(
    spec: ClipSpec, grads: Mapping[str, np.ndarray], dtype: str = "float64"
) -> dict[str, Any]:
    """Clip NumPy gradients: {"grads": {name: array}, "total_norm": float} (norm before clipping).

    Raises NonFiniteError naming the first non-finite gradient when spec.error_if_nonfinite."""
    if not isinstance(grads, Mapping):
        raise InputError(f"grads must be a table of parameter name -> array; received {type(grads).__name__}")
    g = {k: np.asarray(v, np.float64) for k, v in grads.items()}
    with np.errstate(invalid="ignore", over="ignore"):  # inf and NaN gradients are valid inputs
        return _clip(spec, g)


def _clip(spec: ClipSpec, g: dict[str, np.ndarray]) -> dict[str, Any]:
    n = total_norm(g, spec.norm_type)
    if spec.error_if_nonfinite and not math.isfinite(n):
        raise NonFiniteError(nonfinite_norm_message(spec, n, first_nonfinite(g)))
    mode = spec.mode
    # by value first; a norm rule then sees the clamped gradients (torch's two calls)
    clamped = g if spec.clip_value is None else {k: np.clip(v, -spec.clip_value, spec.clip_value) for k, v in g.items()}
    if mode == "value":
        out = clamped
    elif mode == "global_norm":
        m = n if spec.clip_value is None else total_norm(clamped, spec.norm_type)
        out = {k: _scale(v, m, spec) for k, v in clamped.items()}
    elif mode == "per_parameter":
        out = {k: _scale(v, vector_norm(v, spec.norm_type), spec) for k, v in clamped.items()}
    else:
        out = dict(g)
    return {"grads": out, "total_norm": n}
