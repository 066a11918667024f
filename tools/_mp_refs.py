"""High-precision references: the losses' mathematics evaluated with mpmath, independent of any float
formula (tests/test_oracle_edges.py checks the oracle with them; gen_loss_edge_cases.py writes cases).

- `sigmoid_focal`: torchvision.ops.sigmoid_focal_loss (Lin et al. 2017; torchvision/ops/focal_loss.py,
  pytorch/vision@148ddaa) as mathematics: α_t·(1 − p_t)^γ·ce with p = σ(x), p_t = p·y + (1 − p)(1 − y),
  ce = −y·log p − (1 − y)·log(1 − p), written as torchvision writes it (1 − p by subtraction) with
  enough digits that the subtraction loses none: DIGITS plus the |x|/ln 10 digits that 1 − σ(x) ≈ e^−|x|
  cancels; its derivative in x by mpmath's numerical differentiation at the same precision.
- `cross_entropy`: −log softmax(x)_y for one row of logits and a class index, and its gradient
  softmax(x) − onehot(y), at DIGITS plus the digits a dominant class's log Σ exp cancels.
- `bce_with_logits`: torch's BCEWithLogitsLoss, (1 − y)·x − (1 + (pw − 1)·y)·log σ(x), as written, with
  the digits that x − log σ(x) ≈ e^x cancels at x ≪ 0; its derivative the same way.
"""

from __future__ import annotations

from typing import Any

import mpmath as mp

DIGITS = 60


def sigmoid_focal(x: float, y: float, gamma: float, alpha: float) -> tuple[Any, Any]:
    """torchvision's sigmoid_focal_loss and its derivative in x, each to DIGITS significant digits."""
    with mp.workdps(DIGITS + int(abs(x) / 2.302585) + 1):
        def loss(t: Any) -> Any:
            s = 1 / (1 + mp.exp(-t))
            m = y * (1 - s) + (1 - y) * s  # 1 − p_t
            at = 1 if alpha < 0 else alpha * y + (1 - alpha) * (1 - y)
            ce = -(y * mp.log(s) + (1 - y) * mp.log(1 - s))
            return at * m ** mp.mpf(gamma) * ce

        xm = mp.mpf(x)
        return loss(xm), mp.diff(loss, xm)


def bce_with_logits(x: float, y: float, pos_weight: float = 1.0) -> tuple[Any, Any]:
    """torch's binary_cross_entropy_with_logits and its derivative in x, each to DIGITS significant digits."""
    with mp.workdps(DIGITS + int(abs(x) / 2.302585) + 1):
        def loss(t: Any) -> Any:
            return (1 - y) * t - (1 + (pos_weight - 1) * y) * mp.log(1 / (1 + mp.exp(-t)))

        xm = mp.mpf(x)
        return loss(xm), mp.diff(loss, xm)


def cross_entropy(x: list[float], y: int) -> tuple[Any, list[Any]]:
    """−log softmax(x)_y and its gradient in x (softmax − onehot), each to DIGITS significant digits."""
    spread = max(x) - min(x)
    with mp.workdps(DIGITS + int(spread / 2.302585) + 1):
        xs = [mp.mpf(v) for v in x]
        total = mp.fsum(mp.exp(v) for v in xs)
        probs = [mp.exp(v) / total for v in xs]
        return mp.log(total) - xs[y], [p - (1 if c == y else 0) for c, p in enumerate(probs)]
