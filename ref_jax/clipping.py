"""Gradient clipping by global norm, per parameter or by value; the pre-clip norm is returned.

The rules are conformance.config.clip's: eps > 0 is torch's clip_grad_norm_ (always multiply by
min(c / (n + eps), 1)); eps = 0 is optax.clip_by_global_norm (unchanged when n < c, else g / n · c).
The total norm is the norm of the per-parameter norms (torch.nn.utils.get_total_norm) and is what
trainers log as `grad_norm`. Clip after unscaling (precision.unscale_grads): the threshold is in
the gradients' true scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from conformance.config.clip import ClipSpec
from conformance.errors import InputError, NonFiniteError
from conformance.rules.nonfinite import nonfinite_norm_message
from ref_jax._clip_transforms import clip_transform, tree_total_norm
from ref_jax._trees import is_traced, named_leaves
from ref_jax.backend import framework_dtype, to_numpy

__all__ = ["check_norm", "clip_and_norm", "clip_gradients", "total_norm"]


def _check_tree(grads: Any) -> None:
    if grads is None or isinstance(grads, (str, bytes)):
        raise InputError(f"grads must be a mapping of parameter name -> gradient; received {type(grads).__name__}")


def total_norm(grads: Any, norm_type: float = 2.0) -> Any:
    """The norm of order `norm_type` of all gradients as one vector (norms of per-parameter norms)."""
    _check_tree(grads)
    return tree_total_norm(grads, norm_type)


def check_norm(spec: ClipSpec, norm: Any, grads: Any) -> None:
    """Raise NonFiniteError naming the first non-finite gradient when spec.error_if_nonfinite and
    the total norm is NaN or inf (host-side; synchronizes)."""
    if not spec.error_if_nonfinite:
        return
    value = float(norm)
    if math.isfinite(value):
        return
    bad = next((k for k, g in named_leaves(grads) if not bool(jnp.all(jnp.isfinite(g)))), None)
    raise NonFiniteError(nonfinite_norm_message(spec, value, bad))


def clip_gradients(spec: ClipSpec, grads: Any) -> tuple[Any, Any]:
    """Clip a mapping name -> gradient by `spec`; return (clipped gradients, total norm before clipping).

    torch clips the given tensors in place (pass {name: p.grad}); JAX returns new arrays and is
    traceable. With spec.error_if_nonfinite a non-finite norm raises NonFiniteError naming the first
    bad gradient (JAX: when called outside jit; inside jit, call check_norm on the returned norm)."""
    norm = total_norm(grads, spec.norm_type)
    if not is_traced(norm):
        check_norm(spec, norm, grads)
    tx = clip_transform(spec)
    clipped, _ = tx.update(grads, tx.init(grads))
    return clipped, norm


def clip_and_norm(spec: ClipSpec, grads: dict[str, np.ndarray], dtype: str = "float64") -> dict[str, Any]:
    """Clip NumPy gradients: {"grads": {name: array}, "total_norm": float} (norm before clipping).

    Raises NonFiniteError naming the first non-finite gradient when spec.error_if_nonfinite."""
    if not isinstance(grads, Mapping):
        raise InputError(f"grads must be a mapping of parameter name -> gradient; received {type(grads).__name__}")
    dt = framework_dtype(dtype)
    arrays = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in grads.items()}
    clipped, norm = clip_gradients(spec, arrays)
    return {"grads": {k: to_numpy(v) for k, v in clipped.items()}, "total_norm": float(norm)}
