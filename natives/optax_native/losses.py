"""optax.losses for a [loss] spec, reduced by hand as optax users do (optax losses return one value per
element or example): the recipes of docs/divergences.md#losses.

mse → squared_error; huber → huber_loss; smooth_l1 → huber_loss(delta=β) / β; bce_with_logits →
sigmoid_binary_cross_entropy (× weight); cross_entropy → softmax_cross_entropy_with_integer_labels,
or softmax_cross_entropy against smooth_labels (× class weights), classes moved to the last axis,
ignore_index as a mask; kl_div → kl_divergence / kl_divergence_with_log_targets, which sum the class
axis (so "mean" is their mean over examples); sigmoid_focal → sigmoid_focal_loss (alpha = -1 as
alpha=None) × weight. Per-sample weights multiply the per-element values before the reduction, as
optax users weigh them (docs/divergences.md L-SAMPLE). optax has no l1, nll or pos_weight, and no
per-element kl_div. JAX has no autocast: a half-precision case runs in that dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from conformance.config import LossSpec
from conformance.rules.inputs import check_loss_inputs
from natives._protocol import refuse, require
from natives.optax_native.backend import dtype_of, to_numpy

INDEX_TARGETS = ("cross_entropy", "nll")


def supported(spec: LossSpec) -> None:
    """The loss specs optax.losses can express (UnsupportedError otherwise)."""
    if spec.name in ("l1", "nll"):
        raise refuse(f"loss.name = {spec.name!r}", "optax.losses has no such loss")
    if spec.pos_weight is not None:
        raise refuse("loss.pos_weight", "optax.losses.sigmoid_binary_cross_entropy has no pos_weight")
    if spec.name == "kl_div" and spec.reduction == "none":
        raise refuse("loss.reduction = 'none' for kl_div", "optax.losses.kl_divergence sums the class axis")
    require(spec, "loss", "z_loss", (0.0,), "optax.losses.softmax_cross_entropy")


def elementwise(spec: LossSpec, x: jax.Array, t: jax.Array, w: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """(ℓ, c): optax's per-element (or per-example) loss and each one's share of the mean."""
    name = spec.name
    if name == "mse":
        ell = optax.losses.squared_error(x, t)
    elif name == "huber":
        ell = optax.losses.huber_loss(x, t, delta=spec.delta)
    elif name == "smooth_l1":
        ell = optax.losses.huber_loss(x, t, delta=spec.beta) / spec.beta
    elif name == "bce_with_logits":
        ell = optax.losses.sigmoid_binary_cross_entropy(x, t)
        ell = ell * w if w is not None else ell
    elif name == "sigmoid_focal":
        ell = optax.losses.sigmoid_focal_loss(x, t, alpha=None if spec.alpha == -1 else spec.alpha, gamma=spec.gamma)
        ell = ell * w if w is not None else ell
    elif name == "kl_div":
        kl = optax.losses.kl_divergence_with_log_targets if spec.log_target else optax.losses.kl_divergence
        ell = kl(x, t)
    else:
        return _cross_entropy(spec, x, t, w)
    return ell, jnp.ones_like(ell)


def _cross_entropy(spec: LossSpec, x: jax.Array, t: jax.Array, w: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    logits = jnp.moveaxis(x, 1, -1) if x.ndim > 1 else x  # torch's classes are on dim 1
    classes = logits.shape[-1]
    eps = spec.label_smoothing
    if jnp.issubdtype(t.dtype, jnp.integer):
        valid = t != spec.ignore_index
        safe = jnp.where(valid, t, 0)
        if eps == 0:  # class weights as the weight of each example's label
            ell = optax.losses.softmax_cross_entropy_with_integer_labels(logits, safe)
            ell = ell * w[safe] if w is not None else ell
        else:
            q = optax.smooth_labels(jax.nn.one_hot(safe, classes, dtype=logits.dtype), eps)
            ell = optax.losses.softmax_cross_entropy(logits, q * w if w is not None else q)
        c = jnp.where(valid, w[safe] if w is not None else 1.0, 0.0).astype(logits.dtype)
        return jnp.where(valid, ell, 0.0), c
    q = jnp.moveaxis(t, 1, -1) if t.ndim > 1 else t
    q = optax.smooth_labels(q, eps) if eps else q
    ell = optax.losses.softmax_cross_entropy(logits, q * w if w is not None else q)
    return ell, jnp.ones_like(ell)


def reduce(spec: LossSpec, ell: jax.Array, c: jax.Array, mask: jax.Array | None,
           sample_weight: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(value, sum, count) of the spec's reduction, masked elements left out, each element's loss
    times its sample's weight."""
    if sample_weight is not None:
        ell = ell * sample_weight.reshape(sample_weight.shape + (1,) * (ell.ndim - sample_weight.ndim))
    if mask is not None:
        ell, c = jnp.where(mask, ell, 0.0), jnp.where(mask, c, 0.0)
    total, count = jnp.sum(ell), jnp.sum(c)
    if spec.reduction == "none":
        return ell, total, count
    if spec.reduction == "sum":
        return total, total, count
    return total / count, total, count


def arrays(spec: LossSpec, target: np.ndarray, weight: np.ndarray | None, dt: Any) -> tuple[jax.Array, jax.Array | None]:
    """The target (class indices as int32) and the weight (inputs' array, else the spec's)."""
    index = spec.name in INDEX_TARGETS and np.issubdtype(np.asarray(target).dtype, np.integer)
    t = jnp.asarray(target, jnp.int32) if index else jnp.asarray(np.asarray(target, np.float64), dt)
    w = weight if weight is not None else (None if spec.weight is None else np.asarray(spec.weight))
    return t, None if w is None else jnp.asarray(np.asarray(w, np.float64), dt)


def loss_value_and_grad(spec: LossSpec, prediction: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None,
                        mask: np.ndarray | None = None, sample_weight: np.ndarray | None = None,
                        dtype: str = "float64") -> dict[str, Any]:
    """The loss by optax.losses, its jax.grad gradient, sum and count."""
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    supported(spec)
    dt = dtype_of(dtype)
    t, w = arrays(spec, target, weight, dt)
    m = None if mask is None else jnp.asarray(mask, bool)
    sw = None if sample_weight is None else jnp.asarray(np.asarray(sample_weight, np.float64), dt)

    def f(x: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
        value, total, count = reduce(spec, *elementwise(spec, x, t, w), m, sw)
        return jnp.sum(value), (value, total, count)

    grad, (value, total, count) = jax.jit(jax.grad(f, has_aux=True))(jnp.asarray(np.asarray(prediction, np.float64), dt))
    return {"value": to_numpy(value), "grad": to_numpy(grad), "sum": float(total), "count": float(count)}
