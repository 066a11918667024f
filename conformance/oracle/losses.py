"""Losses in NumPy float64, value and gradient, written from the equations (torch's semantics).

Notation: x is the prediction, y the target, m an optional element mask. Every loss is first an
element-wise loss ℓ_i (shape: the prediction without its class dimension for cross_entropy/nll,
else the prediction's shape) and an element count weight c_i. Then, over unmasked elements,

    sum = Σ_i m_i ℓ_i,    count = Σ_i m_i c_i,    mean = sum / count.

c_i is 1, except for class-index targets with class weights w, where c_i = w_{y_i} (torch's
weighted mean), and ignored targets (y_i = ignore_index), where ℓ_i = c_i = 0. For kl_div,
`batchmean` divides the sum by the batch size instead. `grad` is d(value)/dx; for
reduction = "none" it is d(Σ value)/dx.

Per-sample weights s (Keras's `sample_weight`, docs/contract.md §3) multiply the element loss and
leave the count alone: sum = Σ_i m_i s_i ℓ_i, count = Σ_i m_i c_i; s has the leading dimensions of
ℓ's shape and is broadcast over the rest. A masked element contributes exactly 0, even where ℓ_i
is NaN or ±inf (a mask selects, it does not multiply).

z-loss (cross_entropy's `z_loss` = z > 0, PaLM's auxiliary term as MaxText and OLMo write it): each
element's loss gains z·c_i·(log Z_i)², log Z_i = log Σ_k exp(x_{i,k}), weighted by the element's
count weight c_i, so ignored elements add nothing and the mean divides the z terms by the same
count as the cross-entropy (Σ_i m_i c_i: the valid tokens, or Σ w_{y_i} with class weights). It does
not depend on the target, so label smoothing leaves it alone; sample weights multiply it with ℓ_i.
Its gradient is d(z·(log Z)²)/dx_k = 2z·log Z·softmax(x)_k.

-inf logits (probability 0) follow IEEE arithmetic as torch does: cross_entropy/nll are +inf where
the target's own class is -inf (finite gradients), probability targets give NaN where a -inf class
has q·w = 0 (0·(-inf)), and bce_with_logits is NaN at a -inf logit ((1−y)·x − log σ(x) is
−inf + inf) with the finite gradient −y·pw.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conformance.config.loss import LossSpec
from conformance.rules.inputs import (
    bool_mask,
    check_loss_inputs,
    class_dim,
    is_index_target,
)

GradFn = Callable[[np.ndarray], np.ndarray]  # upstream weights u (element shape) -> d(Σ u ℓ)/dx


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log p_k = x_k - log Σ_c exp(x_c), over the last axis, as (x_k − m) − log1p(s): m the row's
    maximum, s = Σ exp(x_c − m) over every class but one maximal one (whose term is exactly 1), so
    that a dominant class keeps log p ≈ −s instead of cancelling to 0."""
    top = x.max(axis=-1, keepdims=True)
    e = np.exp(x - top)
    np.put_along_axis(e, np.argmax(x, axis=-1)[..., None], 0.0, axis=-1)
    return (x - top) - np.log1p(e.sum(axis=-1, keepdims=True))


def log_sigmoid(x: np.ndarray) -> np.ndarray:
    """log σ(x) = min(x, 0) - log(1 + exp(-|x|)), stable for large |x|."""
    return np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x)))


def _cross_entropy(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None):
    """ℓ_i = (1-ε)·(−w_{y_i} log p_{i,y_i}) + (ε/C)·Σ_c (−w_c log p_{i,c})   (class indices)
    ℓ_i = −Σ_c w_c q'_{i,c} log p_{i,c},  q' = (1-ε) q + ε/C                 (probabilities q)"""
    cdim = class_dim(x)
    z = np.moveaxis(x, cdim, -1)  # classes last
    n_classes = z.shape[-1]
    eps = spec.label_smoothing
    logp = log_softmax(z)
    p = np.exp(logp)
    wc = np.ones(n_classes) if w is None else w
    if not is_index_target(spec, x, y):
        q = np.moveaxis(y, cdim, -1) * (1 - eps) + eps / n_classes
        ell = -(wc * q * logp).sum(-1)
        count = np.ones(ell.shape)

        def grad(u: np.ndarray) -> np.ndarray:
            # d(−Σ_c w_c q_c log p_c)/dz_k = p_k Σ_c w_c q_c − w_k q_k
            g = p * (wc * q).sum(-1, keepdims=True) - wc * q
            return np.moveaxis(g * u[..., None], -1, cdim)

        return ell, count, grad
    valid = y != spec.ignore_index
    safe = np.where(valid, y, 0)
    onehot = np.eye(n_classes)[safe]
    wy = np.where(valid, wc[safe], 0.0)
    nll = -np.take_along_axis(logp, safe[..., None], -1)[..., 0]
    ell = (1 - eps) * wy * nll
    if eps > 0:  # without smoothing torch never forms Σ_c log p_c (−inf with a −inf logit)
        ell = ell + (eps / n_classes) * -(wc * logp).sum(-1)
    ell = np.where(valid, ell, 0.0)

    # d(−log p_j)/dz_k = p_k − δ_jk, with p_j − 1 as −Σ_{k≠j} p_k (no cancellation at p_j ≈ 1)
    p_minus = np.where(onehot == 1, -(p * (1 - onehot)).sum(-1, keepdims=True), p)

    def grad(u: np.ndarray) -> np.ndarray:
        g = (1 - eps) * wy[..., None] * p_minus + (eps / n_classes) * (wc.sum() * p - wc)
        return np.moveaxis(np.where(valid[..., None], g, 0.0) * u[..., None], -1, cdim)

    return ell, wy if w is not None else valid.astype(np.float64), grad


def _nll(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None):
    """ℓ_i = −w_{y_i} x_{i,y_i}   (x holds log-probabilities)"""
    cdim = class_dim(x)
    z = np.moveaxis(x, cdim, -1)
    n_classes = z.shape[-1]
    wc = np.ones(n_classes) if w is None else w
    valid = y != spec.ignore_index
    safe = np.where(valid, y, 0)
    wy = np.where(valid, wc[safe], 0.0)
    ell = np.where(valid, -wy * np.take_along_axis(z, safe[..., None], -1)[..., 0], 0.0)

    def grad(u: np.ndarray) -> np.ndarray:
        return np.moveaxis(-(wy * u)[..., None] * np.eye(n_classes)[safe], -1, cdim)

    return ell, wy if w is not None else valid.astype(np.float64), grad


def _bce_with_logits(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None):
    """ℓ = w·[(1−y)·x − (1 + (pw−1)·y)·log σ(x)] = w·[(1−y)·softplus(x) + pw·y·softplus(−x)]
    dℓ/dx = w·[(1−y)·σ(x) − pw·y·σ(−x)]"""
    # the second forms add two non-negative terms: (1−y)·x − log σ(x) cancels to 0 at x ≪ 0 (true
    # value e^x) and 1 − σ(−x) in the gradient at x ≫ 0; torch computes the first (docs/divergences.md L-BCE-SAT)
    pw = 1.0 if spec.pos_weight is None else np.asarray(spec.pos_weight, np.float64)  # broadcast as torch
    wt = np.ones_like(x) if w is None else np.broadcast_to(w, x.shape)
    ell = wt * ((1 - y) * np.logaddexp(0.0, x) + pw * y * np.logaddexp(0.0, -x))
    ell = np.where(np.isneginf(x), np.nan, ell)  # torch's value at a −inf logit, for every target (L-NEGINF)
    dx = wt * ((1 - y) * np.exp(log_sigmoid(x)) - pw * y * np.exp(log_sigmoid(-x)))
    return ell, np.ones(x.shape), lambda u: dx * u


def _sigmoid_focal(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None):
    """torchvision's sigmoid_focal_loss: ℓ = w·α_t·m^γ·ce, with ce = (1−y)·x − log σ(x) (bce),
    m = 1 − p_t = y·σ(−x) + (1−y)·σ(x), α_t = α·y + (1−α)(1−y) (α = −1: α_t = 1).
    dℓ/dx = w·α_t·[(σ(x) − y)·m^γ + γ·m^(γ−1)·(1 − 2y)·σ(x)σ(−x)·ce]."""
    a, g = spec.alpha, spec.gamma
    ls, ls_neg = log_sigmoid(x), log_sigmoid(-x)
    p, q = np.exp(ls), np.exp(ls_neg)
    ce = -y * ls - (1 - y) * ls_neg  # (1−y)·x − log σ(x), without its cancellation at x ≪ 0
    m = y * q + (1 - y) * p
    f = m**g  # 0^0 = 1
    at = np.ones_like(x) if a < 0 else a * y + (1 - a) * (1 - y)
    wt = at if w is None else at * np.broadcast_to(w, x.shape)
    dm = np.where(m > 0, g * m ** (g - 1), 0.0) if g > 0 else np.zeros_like(x)
    # σ(x) − y written as (1−y)·σ(x) − y·σ(−x): no cancellation where σ(x) rounds to 1 (saturated logits)
    dx = wt * (((1 - y) * p - y * q) * f + dm * (1 - 2 * y) * p * q * ce)
    return wt * ce * f, np.ones(x.shape), lambda u: dx * u


def _regression(spec: LossSpec, x: np.ndarray, y: np.ndarray):
    """mse: e²; l1: |e|; huber: ½e² if |e| ≤ δ else δ(|e| − ½δ);
    smooth_l1: ½e²/β if |e| < β else |e| − ½β (β = 0 is l1); with e = x − y."""
    e = x - y
    a = np.abs(e)
    if spec.name == "mse":
        ell, dx = e * e, 2 * e
    elif spec.name == "l1":
        ell, dx = a, np.sign(e)
    elif spec.name == "huber":
        d = spec.delta
        ell = np.where(a <= d, 0.5 * e * e, d * (a - 0.5 * d))
        dx = np.clip(e, -d, d)
    else:
        b = spec.beta
        if b == 0:
            ell, dx = a, np.sign(e)
        else:
            ell = np.where(a < b, 0.5 * e * e / b, a - 0.5 * b)
            dx = np.where(a < b, e / b, np.sign(e))
    return ell, np.ones(x.shape), lambda u: dx * u


def _kl_div(spec: LossSpec, x: np.ndarray, y: np.ndarray):
    """x = log q. ℓ = p·(log p − x) with 0·log 0 = 0, p = y (or exp(y) when log_target)."""
    if spec.log_target:
        p = np.exp(y)
        ell = p * (y - x)
    else:
        p = y
        safe = np.where(p > 0, p, 1.0)
        ell = np.where(p > 0, p * np.log(safe), 0.0) - p * x
    return ell, np.ones(x.shape), lambda u: -p * u


def _with_z_loss(spec: LossSpec, x: np.ndarray, ell: np.ndarray, c: np.ndarray, grad: GradFn):
    """ℓ_i + z·c_i·(log Z_i)², with d/dx_k += z·c_i·2·log Z_i·softmax(x_i)_k (0 where c_i = 0)."""
    cdim = class_dim(x)
    z = np.moveaxis(x, cdim, -1)
    top = z.max(axis=-1, keepdims=True)
    log_z = top + np.log(np.exp(z - top).sum(axis=-1, keepdims=True))  # (..., 1)
    p = np.exp(z - log_z)
    log_z = log_z[..., 0]
    live = c != 0
    term = np.where(live, spec.z_loss * c * log_z**2, 0.0)
    slope = np.where(live, 2 * spec.z_loss * c * log_z, 0.0)

    def z_grad(u: np.ndarray) -> np.ndarray:
        return grad(u) + np.moveaxis(p * (slope * u)[..., None], -1, cdim)

    return ell + term, c, z_grad


def elementwise(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None):
    """(ℓ, c, grad_fn) for the chosen loss; see the module docstring."""
    if spec.name == "cross_entropy":
        if spec.z_loss:
            return _with_z_loss(spec, x, *_cross_entropy(spec, x, y, w))
        return _cross_entropy(spec, x, y, w)
    if spec.name == "nll":
        return _nll(spec, x, y, w)
    if spec.name == "bce_with_logits":
        return _bce_with_logits(spec, x, y, w)
    if spec.name == "sigmoid_focal":
        return _sigmoid_focal(spec, x, y, w)
    if spec.name == "kl_div":
        return _kl_div(spec, x, y)
    return _regression(spec, x, y)


def loss_value_and_grad(
    spec: LossSpec,
    prediction: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    sample_weight: np.ndarray | None = None,
    dtype: str = "float64",
) -> dict[str, Any]:
    """Evaluate a loss on NumPy inputs: {"value", "grad", "sum", "count"} (float64 arrays).

    `dtype` is accepted for symmetry with the framework backends; the oracle always computes in
    float64 (on inputs the harness has already rounded to `dtype`)."""
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    x = np.asarray(prediction, np.float64)
    y = target if np.issubdtype(target.dtype, np.integer) else np.asarray(target, np.float64)
    w = weight if weight is not None else (None if spec.weight is None else np.asarray(spec.weight))
    w = None if w is None else np.asarray(w, np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # -inf logits: IEEE, as torch
        ell, c, grad_fn = elementwise(spec, x, y, w)
        m = np.ones(ell.shape, bool) if mask is None else bool_mask(mask)
        if sample_weight is not None:
            s = np.asarray(sample_weight, np.float64)
            s = s.reshape(s.shape + (1,) * (ell.ndim - s.ndim))
            ell = s * ell
        else:
            s = np.ones(())
        picked = np.where(m, ell, 0.0)  # a mask selects: 0 even where ℓ is NaN
        total = float(picked.sum())
        count = float(np.where(m, c, 0.0).sum())
        if spec.reduction == "batchmean":
            count = float(x.shape[0]) if x.ndim >= 1 else 1.0
        upstream = np.where(m, s, 0.0)
        if spec.reduction == "none":
            value = picked
        elif spec.reduction == "sum":
            value = np.asarray(total)
        else:
            value, upstream = np.asarray(total / count), upstream / count
        grad = grad_fn(upstream)
    return {"value": np.asarray(value), "grad": grad, "sum": total, "count": count}
