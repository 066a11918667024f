"""Scalar terms of the optimizers' updates, in forms that keep their digits where the formula as
written cancels (tests/test_optimizers_exact.py checks them against mpmath): Adam's bias correction
1 − βᵗ for β near 1, and RAdam's ρ_t early in a run."""

from __future__ import annotations

import numpy as np


def bias_correction(beta: float, t: int) -> float:
    """1 − βᵗ as −expm1(t·log1p(β − 1)) for β in [½, 1), where β − 1 is exact and the result keeps the
    digits 1 − βᵗ as written loses (log10(1/(1 − β)) of them: 6 at β2 = 0.999999); below ½ nothing cancels."""
    if beta < 0.5:
        return 1.0 - beta ** t
    return float(-np.expm1(t * np.log1p(beta - 1.0)))


def radam_rho(beta2: float, t: int) -> float:
    """RAdam's ρ_t = ρ∞ − 2t·β2ᵗ/(1 − β2ᵗ), ρ∞ = 2/(1 − β2) − 1, keeping its digits where ρ_t ≈ t ≪ ρ∞
    (as written the two terms cancel: at β2 = 0.99999, t = 6, 11 digits are left). With q = 1 − β2 and
    λ = −log β2: ρ_t = 2·D/(q·(1 − β2ᵗ)) + 2t − 1, D = 1 − β2ᵗ − t·q = Σ_(n≥2) (−1)^(n+1)·(tλ)ⁿ/n!·(1 − t^(1−n)),
    summed while tλ < ½ (its terms shrink by tλ/n each); from tλ = ½ on ρ_t ≥ ρ∞/5 and the formula as written
    keeps its digits."""
    if beta2 < 0.5:
        return 2 / (1 - beta2) - 1 - 2 * t * beta2 ** t / (1 - beta2 ** t)  # ρ∞ < 3: nothing to cancel
    q, lam = 1.0 - beta2, -float(np.log1p(-(1.0 - beta2)))
    bc = bias_correction(beta2, t)
    if t * lam >= 0.5:
        return 2 / q - 1 - 2 * t * float(np.exp(-t * lam)) / bc
    x = t * lam
    d, power, n = 0.0, x, 1  # power = xⁿ/n!
    while True:
        n += 1
        power *= x / n
        term = power * (1 - float(t) ** (1 - n))
        d += term if n % 2 else -term
        if term <= 1e-17 * abs(d) or term == 0.0:
            return 2 * d / (q * bc) + 2 * t - 1
