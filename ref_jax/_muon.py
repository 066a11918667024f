"""Newton–Schulz orthogonalisation exactly as torch.optim.Muon computes it (torch/optim/_muon.py).

torch runs the iteration in bfloat16: every matmul accumulates in float32 and is rounded to
bfloat16 once, and `addmm(C, A, B, beta, alpha)` rounds `beta·C + alpha·(A@B)` once. Emulating
that rounding makes JAX reproduce torch's bits on the CPU for small matrices (larger ones sum in a
different order and agree to bfloat16 precision). `ns_dtype = "float32" | "float64"` runs the
same iteration in that dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def orthogonalize(g: Any, coefficients: tuple[float, float, float], steps: int, eps: Any, dtype: str) -> Any:
    """torch's `_zeropower_via_newtonschulz(g, coefficients, steps, eps)` in `dtype` (a 2-D array)."""
    a, b, c = coefficients
    low = dtype == "bfloat16"
    store = jnp.bfloat16 if low else jnp.dtype(dtype)
    acc = jnp.float32 if low else store

    def mm(x: Any, y: Any) -> Any:
        return jnp.matmul(x, y, precision=_HIGHEST, preferred_element_type=acc)

    x = g.astype(store)
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T
    norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(acc)))).astype(store)
    norm = jnp.maximum(norm, jnp.asarray(eps).astype(store))
    x = (x.astype(acc) / norm.astype(acc)).astype(store)
    for _ in range(steps):
        gram = mm(x, x.T).astype(store)
        update = (b * gram.astype(acc) + c * mm(gram, gram)).astype(store)
        x = (a * x.astype(acc) + mm(update, x)).astype(store)
    return x.T if tall else x
