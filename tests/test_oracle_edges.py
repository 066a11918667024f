"""The oracle and the twins checked against mathematics, not against each other: sigmoid focal loss
and bce_with_logits (value and gradient) against a 60-digit mpmath evaluation of torchvision's and
torch's formulas (tools/_mp_refs.py) at saturated logits, γ in (0, 1], soft labels and pos_weight,
where σ(x) rounds to 1 and a formula written with σ(x) − y, x − log σ(x) or 1 − p_t loses every digit.
The twins' bce follows torch's formula within its absolute bound (L-BCE-SAT). Negative controls: the
cancelling formulas the oracle had, and torchvision's literal one the torch twin had, are flagged.
cross_entropy with class indices: the oracle's log-softmax keeps a dominant class's log p ≈ −Σ e^(x_c − x_y)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config.loss import LossSpec
from conformance.oracle import losses as oracle
from conformance.oracle.losses import log_sigmoid

REL = 1e-12  # float64 evaluation of a few well-conditioned terms: a few ulps
SATURATED = [(20.0, 1.0), (30.0, 1.0), (40.0, 1.0), (-25.0, 0.0), (-45.0, 0.0), (36.5, 0.0), (-36.5, 1.0),
             (3.0, 1.0), (0.5, 0.3), (-3.0, 0.0), (50.0, 0.9)]
_spec = importlib.util.spec_from_file_location("_mp_refs", Path(__file__).resolve().parents[1] / "tools" / "_mp_refs.py")
mp_refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mp_refs)
exact = mp_refs.sigmoid_focal


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


def twin_focal(framework: str, spec: LossSpec, x: np.ndarray, y: np.ndarray, dtype: str) -> tuple[Any, Any]:
    """A twin's element-wise sigmoid focal loss and its gradient (autodiff), as float64 NumPy arrays."""
    if framework == "torch":
        import torch

        from ref_torch.losses import elementwise
        xt = torch.tensor(x, dtype=getattr(torch, dtype), requires_grad=True)
        ell, _ = elementwise(spec, xt, torch.tensor(y, dtype=xt.dtype))
        ell.sum().backward()
        return ell.detach().double().numpy(), xt.grad.double().numpy()
    import jax
    import jax.numpy as jnp

    from ref_jax.losses import elementwise
    with jax.enable_x64(True):
        xj, yj = jnp.asarray(x, dtype), jnp.asarray(y, dtype)
        ell, grad = jax.value_and_grad(lambda a: elementwise(spec, a, yj)[0].sum())(xj)
        return np.asarray(elementwise(spec, xj, yj)[0], np.float64), np.asarray(grad, np.float64)


def twin_worst(framework: str, points: list[tuple[float, float]], gamma: float, alpha: float,
               dtype: str = "float64") -> float:
    """The largest relative error of a twin over value and gradient; a non-finite result is inf."""
    spec = LossSpec(name="sigmoid_focal", gamma=gamma, alpha=alpha)
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    ell, dx = twin_focal(framework, spec, x, y, dtype)
    out = 0.0
    for i, (xi, yi) in enumerate(points):
        value, slope = exact(xi, yi, gamma, alpha)
        for got, want in ((ell[i], value), (dx[i], slope)):
            if not np.isfinite(got):
                return float("inf")
            if abs(want) > (1e-300 if dtype == "float64" else 1e-37):  # representable: relative error counts
                out = max(out, float(abs((mp.mpf(float(got)) - want) / want)))
    return out


# (|γ|·(max|x| + 1) + 8)·u: the power exp(γ·log m) carries |γ·log m|·u (tools/gen_loss_edge_cases.py)
TWIN_REL = {"float64": 2e-14, "float32": 3e-6}
FLOAT32_SATURATED = [(12.0, 1.0), (18.0, 1.0), (20.0, 1.0), (40.0, 1.0), (-45.0, 0.0), (-17.0, 1.0), (0.5, 0.3)]


@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("gamma", [0.25, 0.5, 2.0])
def test_twins_focal_at_saturated_logits(framework: str, gamma: float) -> None:
    assert twin_worst(framework, SATURATED, gamma, 0.25) <= TWIN_REL["float64"]
    assert twin_worst(framework, FLOAT32_SATURATED, gamma, 0.25, "float32") <= TWIN_REL["float32"]


@pytest.mark.parametrize("framework", ["torch", "jax"])
@settings(max_examples=25, deadline=None, derandomize=True)
@given(points=st.lists(st.tuples(st.floats(-60, 60), st.sampled_from([0.0, 1.0, 0.25])), min_size=1, max_size=6),
       gamma=st.floats(0.05, 3.0), alpha=st.sampled_from([-1.0, 0.25, 0.75]))
def test_twins_focal_anywhere(framework: str, points: list[tuple[float, float]], gamma: float, alpha: float) -> None:
    assert twin_worst(framework, points, gamma, alpha) <= TWIN_REL["float64"]


def test_negative_control_torchvisions_literal_formula_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch.nn.functional as F

    from ref_torch import losses as torch_losses

    def literal(spec: LossSpec, x: Any, y: Any) -> Any:  # what the torch twin had: torchvision step by step
        p = torch.sigmoid(x)
        p_t = p * y + (1 - p) * (1 - y)
        ell = F.binary_cross_entropy_with_logits(x, y, reduction="none") * ((1 - p_t) ** spec.gamma)
        return (spec.alpha * y + (1 - spec.alpha) * (1 - y)) * ell

    monkeypatch.setattr(torch_losses, "_sigmoid_focal", literal)
    assert twin_worst("torch", [(3.0, 1.0), (0.5, 0.3)], 0.5, 0.25) <= TWIN_REL["float64"]  # fine where nothing cancels
    assert twin_worst("torch", [(40.0, 1.0)], 0.5, 0.25) == float("inf")  # 0^(γ−1)·0: NaN gradient
    assert twin_worst("torch", [(30.0, 1.0)], 2.0, 0.25) > 1e-6  # σ(x) − y cancels in bce's gradient
    assert twin_worst("torch", [(18.0, 1.0)], 0.5, 0.25, "float32") == float("inf")


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


# --- bce_with_logits -------------------------------------------------------------------------------
BCE_POINTS = [(-40.0, 0.0), (-30.0, 0.0), (-745.0, 0.0), (-20.0, 0.3), (30.0, 1.0), (40.0, 0.7), (700.0, 1.0),
              (0.5, 0.3), (-3.0, 1.0), (3.0, 0.0), (1e-9, 0.5)]


def bce_worst(bce: Callable[..., Any], points: list[tuple[float, float]], pos_weight: float = 1.0) -> float:
    """The largest relative error of `bce` (the oracle's signature) over value and gradient against mpmath.

    Where 0 < y < 1 the gradient (1 − y)·σ(x) − pw·y·σ(−x) is itself a difference, which vanishes at
    σ(x) ≈ y: there its terms' own rounding (u each) bounds what float64 can give, so an error within
    4u of the larger term counts as exact (0 < y < 1 only; at y = 0 or 1 it is one term)."""
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    spec = LossSpec(name="bce_with_logits", pos_weight=None if pos_weight == 1.0 else pos_weight)
    ell, _, grad = bce(spec, x, y, None)
    dx = grad(np.ones(len(points)))
    u = np.finfo(np.float64).eps / 2
    out = 0.0
    for i, (xi, yi) in enumerate(points):
        value, slope = mp_refs.bce_with_logits(xi, yi, pos_weight)
        with mp.workdps(40):
            terms = max((1 - yi) / (1 + mp.exp(-xi)), pos_weight * yi / (1 + mp.exp(xi)))
        for got, want, floor in ((ell[i], value, 0), (dx[i], slope, 4 * u * terms if 0 < yi < 1 else 0)):
            err = abs(mp.mpf(float(got)) - want)
            if abs(want) >= np.finfo(np.float64).tiny and err > floor:  # a normal float64: relative error counts
                out = max(out, float(err / abs(want)))
    return out


@pytest.mark.parametrize("pos_weight", [1.0, 0.5, 3.0])
def test_bce_at_saturated_logits(pos_weight: float) -> None:
    assert bce_worst(oracle._bce_with_logits, BCE_POINTS, pos_weight) <= REL


@settings(max_examples=60, deadline=None, derandomize=True)
@given(x=st.floats(-700, 700), y=st.sampled_from([0.0, 1.0, 0.25, 0.7]), pos_weight=st.sampled_from([1.0, 0.5, 3.0]))
def test_bce_anywhere(x: float, y: float, pos_weight: float) -> None:
    assert bce_worst(oracle._bce_with_logits, [(x, y)], pos_weight) <= REL


def _torch_formula_bce(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: Any) -> Any:
    # the oracle's earlier formula, torch's: (1 − y)·x − coef·log σ(x), gradient (1 − y) − coef·σ(−x)
    pw = 1.0 if spec.pos_weight is None else spec.pos_weight
    coef = 1 + (pw - 1) * y
    dx = (1 - y) - coef * np.exp(log_sigmoid(-x))
    return (1 - y) * x - coef * log_sigmoid(x), np.ones(x.shape), lambda u: dx * u


def test_negative_control_the_cancelling_bce_formula_is_flagged() -> None:
    assert bce_worst(_torch_formula_bce, [(0.5, 0.3), (-3.0, 1.0)]) <= REL  # fine where nothing cancels
    assert bce_worst(_torch_formula_bce, [(-40.0, 0.0)]) >= 1.0  # x − log σ(x) = 0, not e^−40
    assert bce_worst(_torch_formula_bce, [(-30.0, 0.0)]) > 1e-4  # 1 − σ(30) in the gradient


def twin_bce(framework: str, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
    """A twin's element-wise bce_with_logits and its gradient (autodiff), as float64 NumPy arrays."""
    spec = LossSpec(name="bce_with_logits")
    if framework == "torch":
        import torch

        from ref_torch.losses import elementwise
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        ell, _ = elementwise(spec, xt, torch.tensor(y, dtype=xt.dtype))
        ell.sum().backward()
        return ell.detach().numpy(), xt.grad.numpy()
    import jax
    import jax.numpy as jnp

    from ref_jax.losses import elementwise
    with jax.enable_x64(True):
        xj, yj = jnp.asarray(x), jnp.asarray(y)
        grad = jax.grad(lambda a: elementwise(spec, a, yj)[0].sum())(xj)
        return np.asarray(elementwise(spec, xj, yj)[0], np.float64), np.asarray(grad, np.float64)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_twins_bce_follow_torchs_formula_within_its_absolute_bound(framework: str) -> None:
    """The twins compute torch's (1 − y)·x − log σ(x) (L-BCE-SAT): relative error ≤ 1e-13 where nothing
    cancels; at saturated logits the value and gradient carry an absolute error ≤ u·(|x| + 2), the size
    of the terms that cancel (u = 2^−53), never a NaN or infinity."""
    pts = [p for p in BCE_POINTS if abs(p[0]) < 700]
    x, y = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    ell, dx = twin_bce(framework, x, y)
    u = np.finfo(np.float64).eps / 2
    for i, (xi, yi) in enumerate(pts):
        value, slope = mp_refs.bce_with_logits(xi, yi)
        for got, want in ((ell[i], value), (dx[i], slope)):
            err = abs(mp.mpf(float(got)) - want)
            assert np.isfinite(got) and (err <= 1e-13 * abs(want) or err <= u * (abs(xi) + 2)), (xi, yi, got, want)
    value, _ = mp_refs.bce_with_logits(-40.0, 0.0)
    assert ell[0] == 0.0 and float(value) > 4e-18  # measured: torch's formula loses e^−40 entirely


# --- cross_entropy (class indices) -----------------------------------------------------------------
CE_ROWS = [([40.0, 0.0, -3.0], 0), ([0.0, 40.0, -3.0], 1), ([-3.0, 0.5, 60.0, 59.0], 2), ([1.0, 2.0, 3.0], 0),
           ([5.0, 5.0, -30.0], 1), ([0.1, 0.2, 0.3], 2), ([-700.0, 0.0], 1), ([38.0, 0.0], 1)]


def ce_worst(rows: list[tuple[list[float], int]]) -> float:
    """The largest relative error of the oracle's cross_entropy over value and gradient, against mpmath."""
    out = 0.0
    for x, y in rows:
        ell, _, grad = oracle._cross_entropy(LossSpec(name="cross_entropy"), np.array([x]), np.array([y]), None)
        dx = grad(np.ones(1))[0]
        value, slope = mp_refs.cross_entropy(x, y)
        for got, want in ((ell[0], value), *zip(dx, slope)):
            if abs(want) >= np.finfo(np.float64).tiny:
                out = max(out, float(abs((mp.mpf(float(got)) - want) / want)))
    return out


def test_cross_entropy_with_a_dominant_class() -> None:
    assert ce_worst(CE_ROWS) <= REL


@settings(max_examples=60, deadline=None, derandomize=True)
@given(x=st.lists(st.floats(-60, 60), min_size=2, max_size=5), data=st.data())
def test_cross_entropy_anywhere(x: list[float], data: Any) -> None:
    assert ce_worst([(x, data.draw(st.integers(0, len(x) - 1)))]) <= REL


def test_negative_control_a_cancelling_log_softmax_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    def cancelling(x: np.ndarray) -> np.ndarray:  # the oracle's earlier form: x − (m + log Σ exp(x − m))
        top = x.max(axis=-1, keepdims=True)
        return x - (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))

    monkeypatch.setattr(oracle, "log_softmax", cancelling)
    assert ce_worst([([1.0, 2.0, 3.0], 0)]) <= REL  # fine where nothing cancels
    assert ce_worst([([40.0, 0.0, -3.0], 0)]) >= 1.0  # log p = 0, not −e^−40
