"""Losses on framework arrays, reduced through (sum, count): torch's built on
torch.nn.functional, JAX's on optax.losses.

Every loss is an element-wise loss ℓ_i with a count weight c_i; over unmasked elements
sum = Σ m_i ℓ_i, count = Σ m_i c_i and mean = sum / count (c_i = w_{y_i} for weighted class
targets, 0 for ignored ones; see conformance.oracle.losses for the equations). Gradient
accumulation and multi-rank training normalize exactly once, from these sums and counts.
Per-sample weights s multiply ℓ_i (sum = Σ m_i s_i ℓ_i) and leave the count alone; a mask selects
(a masked element adds exactly 0, even where ℓ_i is NaN or inf). cross_entropy's `z_loss` = z adds
z·c_i·(log Z_i)² to ℓ_i (log Z_i the logsumexp of element i's logits): ignored elements add nothing
and the z terms share the cross-entropy's count.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from conformance.config.loss import LossSpec
from conformance.rules.inputs import bool_mask, check_loss_inputs, is_index_target
from ref_jax.backend import framework_dtype, to_numpy

__all__ = ["LossOutput", "compute_loss", "elementwise", "loss_value_and_grad"]


class LossOutput(NamedTuple):
    """value: the reduced loss (per-element for reduction = "none"); sum and count: mean = sum / count."""

    value: Any
    sum: Any
    count: Any


def _classes_last(x: Any) -> Any:
    # torch puts classes on dim 1 (dim 0 when unbatched); optax wants them last.
    return x if x.ndim == 1 else jnp.moveaxis(x, 1, -1)


def _abs(e: Any) -> Any:
    """|e| as e·sign(e), the same value bit for bit, whose gradient is sign(e): 0 at e = 0, as torch's
    l1_loss; jnp.abs's is 1 there (L-L1-ZERO)."""
    return e * jnp.sign(e)


def _huber(x: Any, y: Any, delta: float) -> Any:
    """optax.losses.huber_loss's value, bit for bit, 0.5·q² + δ·(|e| − q) with q = min(|e|, δ), with
    its linear part written as 0 inside the quadratic region: optax's |e| − q sends the gradient
    q + δ − δ back to |e|, which loses q where |e| < u·δ (0 at e = 1e-80: L-HUBER-GRAD). The
    gradient is torch's clamp(e, −δ, δ), δ·sign(e) at the knee too."""
    a = jnp.abs(x - y)
    q = jnp.where(a <= delta, a, delta)  # not minimum: its gradient at a = δ is split in half
    return 0.5 * q**2 + delta * jnp.where(a > delta, a - delta, 0.0)


def elementwise(spec: LossSpec, prediction: Any, target: Any, weight: Any = None) -> tuple[Any, Any]:
    """(ℓ, c): the element-wise loss and the count weight of each element (see module docstring)."""
    name = spec.name
    x = prediction
    if name in ("cross_entropy", "nll"):
        z = _classes_last(x)
        n_classes = z.shape[-1]
        wc = jnp.ones((n_classes,), z.dtype) if weight is None else weight
        if name == "cross_entropy" and target.shape == x.shape:  # class probabilities
            q = optax.smooth_labels(_classes_last(target), spec.label_smoothing)
            ell = optax.losses.softmax_cross_entropy(z, q * wc)
            if spec.z_loss:
                ell = ell + spec.z_loss * jnp.square(jax.nn.logsumexp(z, axis=-1))
            return ell, jnp.ones_like(ell)
        valid = target != spec.ignore_index
        safe = jnp.where(valid, target, 0)  # optax would read -100 out of range (NaN) or wrap -1
        wy = jnp.where(valid, wc[safe], 0).astype(z.dtype)
        if name == "nll":
            ell = jnp.where(valid, -wy * jnp.take_along_axis(z, safe[..., None], -1)[..., 0], 0)
        else:
            nll = optax.losses.softmax_cross_entropy_with_integer_labels(z, safe)
            eps = spec.label_smoothing
            ell = (1 - eps) * wy * nll
            if eps > 0:
                smooth = -(jax.nn.log_softmax(z, axis=-1) * wc).sum(-1)
                ell = ell + (eps / n_classes) * smooth
            if spec.z_loss:  # z·c·(log Z)², c = w_y (1 unweighted); ignored elements: 0 below
                ell = ell + jnp.where(wy != 0, spec.z_loss * wy * jnp.square(jax.nn.logsumexp(z, axis=-1)), 0)
            ell = jnp.where(valid, ell, 0)
        return ell, wy if weight is not None else valid.astype(z.dtype)
    y = target
    if name == "bce_with_logits":
        # torch's formula, not optax.sigmoid_binary_cross_entropy: optax has no pos_weight, and at a
        # -inf logit torch's (1 − y)·x − log σ(x) is NaN where optax gives +inf (L-NEGINF)
        coef = 1.0 if spec.pos_weight is None else 1 + (jnp.asarray(spec.pos_weight, x.dtype) - 1) * y
        ell = (1 - y) * x - coef * jax.nn.log_sigmoid(x)
        if weight is not None:
            ell = ell * weight
    elif name == "sigmoid_focal":
        # torchvision's α = -1 ("no weighting") is optax's alpha = None
        alpha = None if spec.alpha < 0 else spec.alpha
        ell = optax.losses.sigmoid_focal_loss(x, y, alpha=alpha, gamma=spec.gamma)
        if weight is not None:
            ell = ell * weight
    elif name == "mse":
        ell = optax.losses.squared_error(x, y)  # not l2_loss: that is 0.5 * squared_error
    elif name == "l1":
        ell = _abs(x - y)
    elif name == "huber":
        ell = _huber(x, y, spec.delta)
    elif name == "smooth_l1":
        # torch's SmoothL1 is Huber / beta; beta = 0 is L1 (optax's huber(0) would return 0)
        ell = _abs(x - y) if spec.beta == 0 else _huber(x, y, spec.beta) / spec.beta
    else:
        if spec.log_target:
            ell = jnp.exp(y) * (y - x)
        else:
            ell = jax.scipy.special.xlogy(y, y) - y * x  # 0·log 0 = 0, as torch
    return ell, jnp.ones_like(ell)


def compute_loss(
    spec: LossSpec, prediction: Any, target: Any, weight: Any = None, mask: Any = None,
    sample_weight: Any = None,
) -> LossOutput:
    """Evaluate a loss on framework arrays (differentiable; no host checks: see check_loss_inputs).

    Half-precision predictions are upcast to float32 first, as torch.autocast does for losses.
    `mask` holds booleans or 0/1 numbers; `sample_weight` has the leading dimensions of the
    per-element loss and multiplies it."""
    if prediction.dtype in (jnp.float16, jnp.bfloat16):
        prediction = prediction.astype(jnp.float32)
        target = target.astype(jnp.float32) if jnp.issubdtype(target.dtype, jnp.floating) else target
    if weight is None and spec.weight is not None:
        weight = jnp.asarray(spec.weight, prediction.dtype)
    elif weight is not None:
        weight = weight.astype(prediction.dtype)
    ell, count_w = elementwise(spec, prediction, target, weight)
    if sample_weight is not None:
        sw = sample_weight.astype(ell.dtype)
        ell = ell * sw.reshape(sw.shape + (1,) * (ell.ndim - sw.ndim))
    if mask is not None:
        mask = mask if mask.dtype == jnp.bool_ else mask != 0
        ell = jnp.where(mask, ell, 0)
        count_w = jnp.where(mask, count_w, 0)
    total = ell.sum()
    if spec.reduction == "batchmean":
        count = jnp.asarray(float(prediction.shape[0]) if prediction.ndim else 1.0, ell.dtype)
    else:
        count = count_w.sum()
    if spec.reduction == "none":
        return LossOutput(ell, total, count)
    if spec.reduction == "sum":
        return LossOutput(total, total, count)
    return LossOutput(total / count, total, count)


def loss_value_and_grad(
    spec: LossSpec,
    prediction: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    sample_weight: np.ndarray | None = None,
    dtype: str = "float64",
) -> dict[str, Any]:
    """Evaluate a loss on NumPy inputs: {"value", "grad", "sum", "count"} as float64 NumPy.

    Inputs are checked on the host first (same InputError as every backend); `grad` is
    d(value)/d(prediction), or d(Σ value)/d(prediction) for reduction = "none"."""
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    dt = framework_dtype(dtype)
    x = jnp.asarray(np.asarray(prediction, np.float64), dt)
    if is_index_target(spec, prediction, target):
        y = jnp.asarray(np.asarray(target, np.int64))
    else:
        y = jnp.asarray(np.asarray(target, np.float64), dt)
    w = None if weight is None else jnp.asarray(np.asarray(weight, np.float64), dt)
    m = None if mask is None else jnp.asarray(bool_mask(mask))
    sw = None if sample_weight is None else jnp.asarray(np.asarray(sample_weight, np.float64), dt)

    def scalar(x: Any) -> tuple[Any, LossOutput]:
        out = compute_loss(spec, x, y, w, m, sw)
        return out.value.sum(), out

    grad, out = jax.grad(scalar, has_aux=True)(x)
    return {
        "value": to_numpy(out.value),
        "grad": to_numpy(grad),
        "sum": float(out.sum),
        "count": float(out.count),
    }
