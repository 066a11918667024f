"""Muon's Newton–Schulz orthogonalisation with the working dtype as a parameter (`newton_schulz`):
the iteration torch.optim.Muon runs in bfloat16 (torch/optim/_muon.py), which `ns_dtype =
"float32" | "float64"` runs in that dtype instead; the twin's Muon update calls it.
"""

# torch runs the iteration in bfloat16: every matmul accumulates in float32 and is rounded to
# bfloat16 once, and `addmm(C, A, B, beta, alpha)` rounds `beta·C + alpha·(A@B)` once. Emulating
# that rounding (dtype "bfloat16") makes JAX reproduce torch's bits on the CPU for small matrices
# (larger ones sum in a different order and agree to bfloat16 precision).

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def newton_schulz(grad: Any, coefficients: tuple[float, float, float], steps: int, eps: Any, dtype: str) -> Any:
    """torch.optim._muon._zeropower_via_newtonschulz with the working dtype as a parameter (a 2-D
    gradient)."""
    # `dtype` is a name: "bfloat16" emulates torch's rounding (the comment above), not plain bfloat16
    a, b, c = coefficients
    low = dtype == "bfloat16"
    store = jnp.bfloat16 if low else jnp.dtype(dtype)
    acc = jnp.float32 if low else store

    def mm(x: Any, y: Any) -> Any:
        return jnp.matmul(x, y, precision=_HIGHEST, preferred_element_type=acc)

    x = grad.astype(store)
    tall = grad.shape[0] > grad.shape[1]
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
