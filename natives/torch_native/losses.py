"""torch.nn.functional's losses for a [loss] spec: the spec's fields are the functions' arguments.

A mask is applied the way torch users do it: `reduction="none"`, then the masked sum over the masked
count (class weights of the targets for weighted cross_entropy / nll). Half-precision predictions
are upcast to float32 before the loss, as torch.autocast does for losses. `sum` is the loss with
reduction="sum" and `count` the divisor of torch's mean (sum / mean). Per-sample weights as torch
users apply them (torch has no argument): `reduction="none"` values times `sample_weight`, then
summed and divided by the same count (docs/divergences.md L-SAMPLE). sigmoid_focal is
`torchvision.ops.sigmoid_focal_loss` (unsupported where torchvision is not installed; a `weight`
multiplies its `reduction="none"` values, as for the sample weights).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from conformance.config import LossSpec
from conformance.rules.inputs import check_loss_inputs
from natives._protocol import refuse, require
from natives.torch_native.backend import dtype_of, to_numpy

INDEX_TARGETS = ("cross_entropy", "nll")


def functional(spec: LossSpec, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
               reduction: str) -> torch.Tensor:
    """The torch.nn.functional call of the spec."""
    name = spec.name
    if name == "mse":
        return F.mse_loss(x, target, reduction=reduction)
    if name == "l1":
        return F.l1_loss(x, target, reduction=reduction)
    if name == "huber":
        return F.huber_loss(x, target, reduction=reduction, delta=spec.delta)
    if name == "smooth_l1":
        return F.smooth_l1_loss(x, target, reduction=reduction, beta=spec.beta)
    if name == "cross_entropy":
        require(spec, "loss", "z_loss", (0.0,), "torch.nn.functional.cross_entropy")
        return F.cross_entropy(x, target, weight=weight, ignore_index=spec.ignore_index, reduction=reduction,
                               label_smoothing=spec.label_smoothing)
    if name == "nll":
        return F.nll_loss(x, target, weight=weight, ignore_index=spec.ignore_index, reduction=reduction)
    if name == "bce_with_logits":
        pos = None if spec.pos_weight is None else torch.tensor(spec.pos_weight, dtype=x.dtype)
        return F.binary_cross_entropy_with_logits(x, target, weight=weight, reduction=reduction, pos_weight=pos)
    if name == "kl_div":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note that 'mean' divides by every element
            return F.kl_div(x, target, reduction=reduction, log_target=spec.log_target)
    if name == "sigmoid_focal":
        try:
            ops = importlib.import_module("torchvision.ops")
        except ImportError:
            raise refuse("loss.name = 'sigmoid_focal'", "torchvision.ops.sigmoid_focal_loss: torchvision is not "
                                                        "installed") from None
        ell = ops.sigmoid_focal_loss(x, target, alpha=spec.alpha, gamma=spec.gamma, reduction="none")
        ell = ell if weight is None else ell * weight
        return ell if reduction == "none" else ell.sum() if reduction == "sum" else ell.mean()
    raise AssertionError(name)


def targets(spec: LossSpec, target: np.ndarray, weight: np.ndarray | None,
            dt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target (class indices as int64) and the weight (inputs' array, else the spec's) as tensors."""
    index = spec.name in INDEX_TARGETS and np.issubdtype(np.asarray(target).dtype, np.integer)
    t = torch.tensor(target, dtype=torch.long) if index else torch.tensor(np.asarray(target, np.float64), dtype=dt)
    w = weight if weight is not None else (None if spec.weight is None else np.asarray(spec.weight))
    return t, None if w is None else torch.tensor(np.asarray(w, np.float64), dtype=dt)


def tensors(spec: LossSpec, prediction: np.ndarray, target: np.ndarray, weight: np.ndarray | None,
            dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(leaf prediction, the prediction the loss sees, target, weight) as torch tensors."""
    dt = dtype_of(dtype)
    x = torch.tensor(np.asarray(prediction, np.float64), dtype=dt, requires_grad=True)
    seen = x.float() if dt in (torch.bfloat16, torch.float16) else x  # autocast runs losses in float32
    return (x, seen, *targets(spec, target, weight, seen.dtype))


def masked(spec: LossSpec, seen: torch.Tensor, t: torch.Tensor, w: torch.Tensor | None,
           mask: np.ndarray | None, sample_weight: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """(value, sum, count) over the masked elements: Σ m·s·ℓ / Σ m·c, ℓ from reduction="none", s the
    sample weight (1 without), c the element's share of torch's mean (its target's class weight, 0
    when ignored); no mask: all."""
    ell = functional(spec, seen, t, w, "none")
    if sample_weight is not None:
        s = torch.tensor(np.asarray(sample_weight, np.float64), dtype=ell.dtype)
        ell = ell * s.reshape(s.shape + (1,) * (ell.dim() - s.dim()))
    m = torch.ones_like(ell, dtype=torch.bool) if mask is None else torch.tensor(np.asarray(mask, bool))
    c = torch.ones_like(ell)
    if spec.name in INDEX_TARGETS and t.dtype == torch.long:
        valid = t != spec.ignore_index
        c = torch.where(valid, w[torch.where(valid, t, 0)] if w is not None else c, torch.zeros_like(c))
    total, count = torch.where(m, ell, 0).sum(), torch.where(m, c, 0).sum()
    if spec.reduction == "sum":
        return total, total, count
    if spec.reduction == "none":
        return torch.where(m, ell, 0), total, count
    if spec.reduction == "batchmean":
        return total / seen.shape[0], total, count
    return total / count, total, count


def loss_value_and_grad(spec: LossSpec, prediction: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None,
                        mask: np.ndarray | None = None, sample_weight: np.ndarray | None = None,
                        dtype: str = "float64") -> dict[str, Any]:
    """The loss of the spec by torch.nn.functional, its autograd gradient, sum and count."""
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    x, seen, t, w = tensors(spec, prediction, target, weight, dtype)
    if mask is not None or sample_weight is not None:
        value, total, count = masked(spec, seen, t, w, mask, sample_weight)
    else:
        value = functional(spec, seen, t, w, spec.reduction)
        with torch.no_grad():
            total = functional(spec, seen, t, w, "sum")
            mean = functional(spec, seen, t, w, "mean")
            count = total / mean if float(mean) != 0 else torch.tensor(float("nan"))
    value.sum().backward()
    return {"value": to_numpy(value), "grad": to_numpy(x.grad), "sum": total.item(), "count": count.item()}
