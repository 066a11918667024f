"""optax's clipping for a [clip] spec: optax.clip (by value) and optax.clip_by_global_norm (no eps; it
clips when the norm is >= max_norm), the norm before clipping from optax.tree.norm.

clip_by_global_norm has no eps (`eps` at torch's default runs optax's rule), takes the 2-norm only,
clips no single parameter and never raises: other norm types, per_parameter and
error_if_nonfinite are unsupported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from conformance.config import ClipSpec
from conformance.config.clip import TORCH_EPS
from natives._protocol import require
from natives.optax_native.backend import dtype_of, to_numpy


def transform(spec: ClipSpec) -> optax.GradientTransformation:
    """The optax transformation that clips as the spec says (identity for none)."""
    if spec.mode == "value":
        return optax.clip(spec.clip_value)
    if spec.mode == "none":
        return optax.identity()
    native = "optax.clip_by_global_norm"
    require(spec, "clip", "per_parameter", (False,), native)
    require(spec, "clip", "error_if_nonfinite", (False,), native)
    require(spec, "clip", "norm_type", (2.0,), native + " (the 2-norm only)")
    require(spec, "clip", "eps", (TORCH_EPS, 0.0), native + " (no eps)")
    if spec.clip_value is not None:  # by value first, then by norm: a chain
        return optax.chain(optax.clip(spec.clip_value), optax.clip_by_global_norm(spec.max_norm))
    return optax.clip_by_global_norm(spec.max_norm)


def clip_and_norm(spec: ClipSpec, grads: Mapping[str, np.ndarray], dtype: str = "float64") -> dict[str, Any]:
    """The clipped gradients and optax.tree.norm of the gradients before clipping."""
    dt = dtype_of(dtype)
    g = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in grads.items()}
    tx = transform(spec)
    clipped, _ = tx.update(g, tx.init(g))
    norm = optax.tree.norm(g, ord=None if spec.norm_type == 2 else spec.norm_type)
    return {"grads": {k: to_numpy(v) for k, v in clipped.items()}, "total_norm": float(norm)}
