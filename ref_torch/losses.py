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

import numpy as np
import torch
import torch.nn.functional as F

from conformance.config.loss import LossSpec
from conformance.rules.inputs import bool_mask, check_loss_inputs, is_index_target
from ref_torch.backend import framework_dtype, to_numpy

__all__ = ["LossOutput", "compute_loss", "elementwise", "loss_value_and_grad"]


class LossOutput(NamedTuple):
    """value: the reduced loss (per-element for reduction = "none"); sum and count: mean = sum / count."""

    value: Any
    sum: Any
    count: Any


def elementwise(spec: LossSpec, prediction: Any, target: Any, weight: Any = None) -> tuple[Any, Any]:
    """(ℓ, c): the element-wise loss and the count weight of each element (see module docstring)."""
    ell, count_w, valid = _elementwise(spec, prediction, target, weight)
    if count_w is not None:
        return ell, count_w
    return ell, (valid.to(ell.dtype) if valid is not None else torch.ones_like(ell))


def _on(values: Any, like: torch.Tensor) -> torch.Tensor:
    """Config numbers as a tensor in `like`'s dtype on its device: made on the host and copied
    without blocking (a blocking copy to an accelerator waits for everything queued before it)."""
    return torch.tensor(values, dtype=like.dtype).to(like.device, non_blocking=True)


def _elementwise(spec: LossSpec, prediction: Any, target: Any, weight: Any = None) -> tuple[Any, Any, Any]:
    # (ℓ, count weights or None, valid mask or None): None, None means a count weight of 1
    # everywhere, and weights None with a mask means 1 where valid, 0 elsewhere; compute_loss sums
    # them without materializing a tensor of ones (one op fewer per call on the trainer's hot path)
    name = spec.name
    if name in ("cross_entropy", "nll"):
        index = name == "nll" or target.shape != prediction.shape
        if name == "cross_entropy":
            ell = F.cross_entropy(prediction, target, weight=weight, ignore_index=spec.ignore_index,
                                  reduction="none", label_smoothing=spec.label_smoothing)
        else:
            ell = F.nll_loss(prediction, target, weight=weight, ignore_index=spec.ignore_index, reduction="none")
        if not index:
            return (_plus_z_loss(spec, prediction, ell, None) if spec.z_loss else ell), None, None
        valid = target != spec.ignore_index
        if weight is None:
            return (_plus_z_loss(spec, prediction, ell, valid) if spec.z_loss else ell), None, valid
        count_w = torch.where(valid, weight[torch.where(valid, target, 0)], 0).to(ell.dtype)
        return (_plus_z_loss(spec, prediction, ell, count_w) if spec.z_loss else ell), count_w, None
    if name == "bce_with_logits":
        pos = None if spec.pos_weight is None else _on(spec.pos_weight, prediction)
        ell = F.binary_cross_entropy_with_logits(prediction, target, weight=weight, pos_weight=pos,
                                                 reduction="none")
    elif name == "sigmoid_focal":
        ell = _sigmoid_focal(spec, prediction, target)
        if weight is not None:
            ell = ell * weight
    elif name == "mse":
        ell = F.mse_loss(prediction, target, reduction="none")
    elif name == "l1":
        ell = F.l1_loss(prediction, target, reduction="none")
    elif name == "huber":
        ell = F.huber_loss(prediction, target, reduction="none", delta=spec.delta)
    elif name == "smooth_l1":
        ell = F.smooth_l1_loss(prediction, target, reduction="none", beta=spec.beta)
    else:
        ell = F.kl_div(prediction, target, reduction="none", log_target=spec.log_target)
    return ell, None, None


def _plus_z_loss(spec: LossSpec, prediction: Any, ell: Any, count_w: Any) -> Any:
    # ℓ + z·c·(log Z)², log Z over torch's class dim; c: None (1), a valid mask, or count weights
    log_z = prediction.logsumexp(0 if prediction.ndim == 1 else 1)
    term = spec.z_loss * log_z.square()
    if count_w is None:
        return ell + term
    if count_w.dtype != torch.bool:
        term = term * count_w
    return ell + torch.where(count_w != 0, term, torch.zeros((), dtype=ell.dtype, device=ell.device))


def _class_sum(spec: LossSpec, prediction: Any, target: Any, weight: Any) -> tuple[Any, Any] | None:
    # (sum, count) of cross_entropy / nll on (N, C) scores and (N,) class indices from one nll_loss
    # call: its total_weight is Σ c_i (c_i = w_{y_i}, 0 where ignored); the trainer's hot path, a
    # few ops fewer per micro-batch than ℓ then two sums. Label smoothing and z-loss take the general path.
    if spec.name not in ("cross_entropy", "nll") or prediction.ndim != 2 or target.ndim != 1 \
            or target.is_floating_point() or spec.z_loss:
        return None
    if spec.name == "cross_entropy":
        if spec.label_smoothing:
            return None
        prediction = prediction.log_softmax(1)
    return _NLL(prediction, target, weight, _SUM, spec.ignore_index)


_NLL = torch.ops.aten.nll_loss_forward.default  # -> (Σ loss, Σ weight): what F.nll_loss does not return
_SUM = 2  # torch's reduction enum (at::Reduction::Sum)


def _sigmoid_focal(spec: LossSpec, x: Any, y: Any) -> Any:
    # torchvision.ops.sigmoid_focal_loss's mathematics, evaluated in log space as optax does: its own
    # 1 − p_t by subtraction (then a power) and σ(x) − y lose every digit at saturated logits, where the
    # gradient is NaN for γ < 1 (docs/divergences.md L-FOCAL)
    log_p, log_q = F.logsigmoid(x), F.logsigmoid(-x)
    ell = -y * log_p - (1 - y) * log_q
    log_m = torch.logaddexp(torch.log(y) + log_q, torch.log1p(-y) + log_p)  # log(1 − p_t)
    ell = ell * torch.exp(spec.gamma * log_m)
    if spec.alpha >= 0:
        ell = (spec.alpha * y + (1 - spec.alpha) * (1 - y)) * ell
    return ell


def compute_loss(
    spec: LossSpec, prediction: Any, target: Any, weight: Any = None, mask: Any = None,
    sample_weight: Any = None,
) -> LossOutput:
    """Evaluate a loss on framework arrays (differentiable; no host checks: see check_loss_inputs).

    Half-precision predictions are upcast to float32 first, as torch.autocast does for losses.
    `mask` holds booleans or 0/1 numbers; `sample_weight` has the leading dimensions of the
    per-element loss and multiplies it."""
    if prediction.dtype in (torch.float16, torch.bfloat16):
        prediction = prediction.float()
        target = target.float() if target.is_floating_point() else target
    if weight is None and spec.weight is not None:
        weight = _on(spec.weight, prediction)
    elif weight is not None:
        weight = weight.to(prediction.dtype)
    if mask is None and sample_weight is None and spec.reduction in ("mean", "sum"):
        fused = _class_sum(spec, prediction, target, weight)
        if fused is not None:
            total, count = fused
            return LossOutput(total / count if spec.reduction == "mean" else total, total, count)
    ell, count_w, valid = _elementwise(spec, prediction, target, weight)
    if sample_weight is not None:
        sw = sample_weight.to(ell.dtype)
        ell = ell * sw.reshape(sw.shape + (1,) * (ell.ndim - sw.ndim))
    if mask is not None:
        mask = mask if mask.dtype == torch.bool else mask != 0
        if count_w is None:
            count_w = valid.to(ell.dtype) if valid is not None else torch.ones_like(ell)
        ell = torch.where(mask, ell, torch.zeros((), dtype=ell.dtype, device=ell.device))
        count_w = torch.where(mask, count_w, torch.zeros((), dtype=ell.dtype, device=ell.device))
    total = ell.sum()
    if spec.reduction == "batchmean":
        count = torch.full((), float(prediction.shape[0]) if prediction.ndim else 1.0, dtype=ell.dtype,
                           device=ell.device)
    elif count_w is not None:
        count = count_w.sum()
    elif valid is not None:
        count = valid.sum(dtype=ell.dtype)  # a sum of ones and zeros: exact, as valid.to(dtype).sum()
    else:
        count = torch.full((), float(ell.numel()), dtype=ell.dtype, device=ell.device)
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
    x = torch.tensor(np.asarray(prediction, np.float64), dtype=dt, requires_grad=True)
    if is_index_target(spec, prediction, target):
        y = torch.tensor(np.asarray(target, np.int64))
    else:
        y = torch.tensor(np.asarray(target, np.float64), dtype=dt)
    w = None if weight is None else torch.tensor(np.asarray(weight, np.float64), dtype=dt)
    m = None if mask is None else torch.tensor(bool_mask(mask))
    sw = None if sample_weight is None else torch.tensor(np.asarray(sample_weight, np.float64), dtype=dt)
    out = compute_loss(spec, x, y, w, m, sw)
    out.value.sum().backward()
    return {
        "value": to_numpy(out.value),
        "grad": to_numpy(x.grad),
        "sum": float(out.sum.detach()),
        "count": float(out.count.detach()),
    }
