"""The references of tools/gen_loss_cases.py that torch.nn.functional lacks, written in torch ops.

- `sigmoid_focal_loss`: torchvision.ops.sigmoid_focal_loss (RetinaNet, Lin et al. 2017), the
  formula of torchvision/ops/focal_loss.py (pytorch/vision commit 148ddaa) in torch ops, since
  torchvision is not a dependency: p = σ(x), ce = F.binary_cross_entropy_with_logits(x, y, "none"),
  p_t = p·y + (1 − p)(1 − y), ℓ = ce·(1 − p_t)^γ, times α_t = α·y + (1 − α)(1 − y) when α ≥ 0;
  then torchvision's reduction ("none" | "mean" | "sum").
- `weighted_mean`: Keras's `sample_weight` reduction (keras.losses.Loss, "sum_over_batch_size")
  over torch's per-element values: Σ m·s·ℓ / Σ m·c, the per-sample weights s broadcast over the
  trailing dimensions, the mask m selecting (torch.where), c the count weights (1, or torch's class
  weight of the target for a weighted cross-entropy).
Never twinstep's code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


def sigmoid_focal_loss(inputs: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0,
                       reduction: str = "none") -> torch.Tensor:
    """torchvision's sigmoid_focal_loss, step by step as torchvision computes it."""
    p = torch.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def weighted_mean(fn_none: Callable[[torch.Tensor], torch.Tensor], sample_weight: np.ndarray,
                  mask: np.ndarray | None = None, count_w: Any = None, reduction: str = "mean") -> Callable:
    """A function of the prediction: torch's per-element values reduced as Keras reduces with
    sample_weight (Σ m s ℓ / Σ m c for "mean", Σ m s ℓ for "sum", m·s·ℓ for "none")."""
    s = torch.tensor(sample_weight, dtype=torch.float64)

    def f(xt: torch.Tensor) -> torch.Tensor:
        ell = fn_none(xt)
        ell = ell * s.reshape(s.shape + (1,) * (ell.ndim - s.ndim))
        m = torch.ones(ell.shape, dtype=torch.bool) if mask is None else torch.tensor(mask) != 0
        ell = torch.where(m, ell, torch.zeros((), dtype=ell.dtype))
        if reduction == "none":
            return ell
        if reduction == "sum":
            return ell.sum()
        c = torch.ones_like(ell) if count_w is None else count_w
        return ell.sum() / torch.where(m, c, torch.zeros((), dtype=ell.dtype)).sum()

    return f
