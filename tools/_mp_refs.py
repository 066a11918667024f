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
- `regression` (mse, l1, huber, smooth_l1) in exact rational arithmetic; `kl_div` and
  `cross_entropy_row` (probabilities, label smoothing, class weights, z-loss) with mpmath, each
  with the size of the terms a float evaluation combines (the bound where they cancel).
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


# --- the other losses: value, gradient and the size of the terms a float evaluation combines ---------
# A float64 evaluation that adds or subtracts terms t_i, each within a few ulps, is off by at most a
# few u·Σ|t_i| (u = 2^−53): relative to the value where the terms do not cancel, and where they do
# (mse's x − y, kl_div at p = e^x, a softmax gradient at p_k ≈ q_k, log Z ≈ 0) that much absolutely,
# however good the formula. `scale` is Σ|t_i| for the value and for each gradient entry.


def regression(name: str, x: float, y: float, param: float = 1.0) -> tuple[Any, Any, Any, Any]:
    """mse, l1, huber (δ = param) or smooth_l1 (β = param) in exact rational arithmetic: (value,
    gradient in x, their scales). At e = x − y = 0, l1's and smooth_l1's (β = 0) slope is torch's 0."""
    from fractions import Fraction

    e = Fraction(x) - Fraction(y)
    a, sign = abs(e), (e > 0) - (e < 0)
    p = Fraction(param)
    if name == "mse":
        value, slope = e * e, 2 * e
    elif name == "l1" or (name == "smooth_l1" and p == 0):
        value, slope = a, Fraction(sign)
    elif name == "huber":
        value, slope = (e * e / 2, e) if a <= p else (p * (a - p / 2), p * sign)
    else:
        value, slope = (e * e / (2 * p), e / p) if a < p else (a - p / 2, Fraction(sign))
    # x − y is rounded once: relative u of |e|, which every formula above carries at most twice
    return value, slope, abs(value), abs(slope)


def kl_div(x: float, y: float, log_target: bool) -> tuple[Any, Any, Any, Any]:
    """torch's kl_div element p·(log p − x), p = y (0·log 0 = 0) or e^y, and its gradient −p."""
    with mp.workdps(DIGITS):
        xm, ym = mp.mpf(x), mp.mpf(y)
        if log_target:
            p = mp.exp(ym)
            return p * (ym - xm), -p, p * (abs(ym) + abs(xm)), p
        if ym == 0:
            return mp.mpf(0), mp.mpf(0), mp.mpf(0), mp.mpf(0)
        lp = mp.log(ym)
        return ym * (lp - xm), -ym, abs(ym * lp) + abs(ym * xm), ym


def cross_entropy_row(x: list[float], target: int | list[float], smoothing: float = 0.0,
                      weight: list[float] | None = None, z: float = 0.0) -> tuple[Any, list[Any], Any, list[Any]]:
    """One row of torch's cross_entropy (a class index or probabilities, label smoothing, class
    weights) plus z·c·(log Z)², c the row's count weight (w_y for a weighted index, else 1):
    ℓ = −Σ_c w_c q'_c log p_c with q' = (1 − ε)·q + ε/C (q one-hot for an index), and its gradient
    p_k·Σ_c w_c q'_c − w_k q'_k + 2zc·log Z·p_k."""
    n = len(x)
    spread = max(x) - min(x)
    with mp.workdps(DIGITS + int(spread / 2.302585) + 1):
        xs = [mp.mpf(v) for v in x]
        w = [mp.mpf(1)] * n if weight is None else [mp.mpf(v) for v in weight]
        q = [mp.mpf(int(c == target)) for c in range(n)] if isinstance(target, int) else [mp.mpf(v) for v in target]
        qs = [(1 - mp.mpf(smoothing)) * qc + mp.mpf(smoothing) / n for qc in q]
        top = max(xs)
        log_rest = mp.log(mp.fsum(mp.exp(v - top) for v in xs))
        log_z = top + log_rest
        logp = [v - log_z for v in xs]
        p = [mp.exp(v) for v in logp]
        c = w[target] if isinstance(target, int) and weight is not None else mp.mpf(1)
        terms = [-w[k] * qs[k] * logp[k] for k in range(n)]
        value = mp.fsum(terms) + z * c * log_z**2
        # log Z = top + log Σ e^(x − top) is off by u·(|top| + |log Σ|): the z term's share of the scale
        z_size = 2 * z * c * (abs(log_z) + abs(top) + abs(log_rest))
        scale = mp.fsum(abs(t) for t in terms) + z * c * log_z**2 + z_size * abs(log_z)
        wq = mp.fsum(w[k] * qs[k] for k in range(n))
        grad = [p[k] * wq - w[k] * qs[k] + 2 * z * c * log_z * p[k] for k in range(n)]
        grad_scale = [p[k] * abs(wq) + abs(w[k] * qs[k]) + p[k] * z_size for k in range(n)]
        return value, grad, scale, grad_scale
