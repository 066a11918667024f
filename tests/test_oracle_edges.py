"""The oracle checked against mathematics, not against the twins: its sigmoid focal loss (value and
gradient) against a 60-digit mpmath evaluation of torchvision's formula at saturated logits, γ in
(0, 1] and soft labels, where σ(x) rounds to 1 and a formula written with σ(x) − y or x − log σ(x)
loses every digit. Negative control: the cancelling formula the oracle had is flagged."""

from __future__ import annotations

from typing import Any, Callable

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config.loss import LossSpec
from conformance.oracle import losses as oracle
from conformance.oracle.losses import log_sigmoid

DIGITS = 60
REL = 1e-12  # float64 evaluation of a few well-conditioned terms: a few ulps
SATURATED = [(20.0, 1.0), (30.0, 1.0), (40.0, 1.0), (-25.0, 0.0), (-45.0, 0.0), (36.5, 0.0), (-36.5, 1.0),
             (3.0, 1.0), (0.5, 0.3), (-3.0, 0.0), (50.0, 0.9)]


def exact(x: float, y: float, gamma: float, alpha: float) -> tuple[Any, Any]:
    """torchvision's sigmoid_focal_loss and its derivative in x, evaluated with DIGITS digits."""
    with mp.workdps(DIGITS):
        def loss(t: Any) -> Any:
            s = 1 / (1 + mp.exp(-t))
            m = y * (1 - s) + (1 - y) * s  # 1 − p_t
            at = 1 if alpha < 0 else alpha * y + (1 - alpha) * (1 - y)
            ce = -(y * mp.log(s) + (1 - y) * mp.log(1 - s))
            return at * m ** mp.mpf(gamma) * ce

        xm = mp.mpf(x)
        return loss(xm), mp.diff(loss, xm)


def worst(focal: Callable[..., Any], points: list[tuple[float, float]], gamma: float, alpha: float) -> float:
    """The largest relative error of `focal` (the oracle's signature) over value and gradient."""
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    ell, _, grad = focal(LossSpec(name="sigmoid_focal", gamma=gamma, alpha=alpha), x, y, None)
    dx = grad(np.ones(len(points)))
    out = 0.0
    for i, (xi, yi) in enumerate(points):
        value, slope = exact(xi, yi, gamma, alpha)
        for got, want in ((ell[i], value), (dx[i], slope)):
            if want != 0:
                out = max(out, float(abs((mp.mpf(float(got)) - want) / want)))
    return out


@pytest.mark.parametrize("gamma", [0.25, 0.5, 0.9, 1.0, 2.0])
def test_focal_at_saturated_logits(gamma: float) -> None:
    assert worst(oracle._sigmoid_focal, SATURATED, gamma, 0.25) <= REL


@settings(max_examples=60, deadline=None, derandomize=True)
@given(x=st.floats(-60, 60), y=st.sampled_from([0.0, 1.0, 0.25]), gamma=st.floats(0.05, 3.0),
       alpha=st.sampled_from([-1.0, 0.25, 0.75]))
def test_focal_anywhere(x: float, y: float, gamma: float, alpha: float) -> None:
    assert worst(oracle._sigmoid_focal, [(x, y)], gamma, alpha) <= REL


def _cancelling_focal(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: Any) -> Any:
    # the oracle's earlier formula: σ(x) − y and (1−y)·x − log σ(x), exact in algebra, not in floats
    g, a = spec.gamma, spec.alpha
    ls = log_sigmoid(x)
    p, q = np.exp(ls), np.exp(log_sigmoid(-x))
    ce = (1 - y) * x - ls
    m = y * q + (1 - y) * p
    at = a * y + (1 - a) * (1 - y)
    dm = np.where(m > 0, g * m ** (g - 1), 0.0)
    dx = at * ((p - y) * m**g + dm * (1 - 2 * y) * p * q * ce)
    return at * ce * m**g, np.ones(x.shape), lambda u: dx * u


def test_negative_control_a_cancelling_formula_is_flagged() -> None:
    assert worst(_cancelling_focal, [(3.0, 1.0), (0.5, 0.3)], 0.5, 0.25) <= REL  # fine where nothing cancels
    assert worst(_cancelling_focal, [(40.0, 1.0)], 0.5, 0.25) > 0.1  # σ(40) = 1: the −q·q^γ term is lost
    assert worst(_cancelling_focal, [(-45.0, 0.0)], 0.5, 0.25) > 0.1  # x − log σ(x) cancels to 0
