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

import numpy as np
import torch

from conformance.config.clip import ClipSpec
from conformance.errors import InputError, NonFiniteError
from conformance.rules.nonfinite import nonfinite_norm_message
from ref_torch._clip_transforms import clip_with_norm
from ref_torch.backend import framework_dtype, to_numpy

__all__ = ["check_norm", "clip_and_norm", "clip_gradients", "total_norm"]


def _present(grads: Mapping[str, Any]) -> dict[str, Any]:
    if type(grads) is not dict and not isinstance(grads, Mapping):
        raise InputError(f"grads must be a mapping of parameter name -> gradient; received {type(grads).__name__}")
    return {k: g for k, g in grads.items() if g is not None}


def total_norm(grads: Any, norm_type: float = 2.0) -> Any:
    """The norm of order `norm_type` of all gradients as one vector (norms of per-parameter norms)."""
    tensors = list(_present(grads).values())
    return torch.nn.utils.get_total_norm(tensors, norm_type, error_if_nonfinite=False)


def check_norm(spec: ClipSpec, norm: Any, grads: Any) -> None:
    """Raise NonFiniteError naming the first non-finite gradient when spec.error_if_nonfinite and
    the total norm is NaN or inf (host-side; synchronizes)."""
    if not spec.error_if_nonfinite:
        return
    value = float(norm)
    if math.isfinite(value):
        return
    bad = next((k for k, g in _present(grads).items() if not bool(torch.isfinite(g).all())), None)
    raise NonFiniteError(nonfinite_norm_message(spec, value, bad))


@torch.no_grad()
def clip_gradients(spec: ClipSpec, grads: Any) -> tuple[Any, Any]:
    """Clip a mapping name -> gradient by `spec`; return (clipped gradients, total norm before clipping).

    torch clips the given tensors in place (pass {name: p.grad}); JAX returns new arrays and is
    traceable. With spec.error_if_nonfinite a non-finite norm raises NonFiniteError naming the first
    bad gradient (JAX: when called outside jit; inside jit, call check_norm on the returned norm)."""
    present = _present(grads)
    norm = total_norm(present, spec.norm_type)
    check_norm(spec, norm, present)
    clip_with_norm(spec, present, norm)
    return grads, norm


def clip_and_norm(spec: ClipSpec, grads: dict[str, np.ndarray], dtype: str = "float64") -> dict[str, Any]:
    """Clip NumPy gradients: {"grads": {name: array}, "total_norm": float} (norm before clipping).

    Raises NonFiniteError naming the first non-finite gradient when spec.error_if_nonfinite."""
    dt = framework_dtype(dtype)
    tensors = {k: torch.tensor(np.asarray(v, np.float64), dtype=dt) for k, v in _present(grads).items()}
    clipped, norm = clip_gradients(spec, tensors)
    return {"grads": {k: to_numpy(v) for k, v in clipped.items()}, "total_norm": float(norm)}
