"""The remaining losses checked against mathematics, not against each other: mse, l1, huber and
smooth_l1 in exact rational arithmetic, kl_div (probabilities and log targets) and cross_entropy
(probabilities, label smoothing, class weights, z-loss) with mpmath at 60+ digits (tools/_mp_refs.py),
value and gradient, on the oracle and both twins (float64, reduction "none"), at inputs hypothesis
draws from the edges: huge and tiny magnitudes, subnormals, the huber / smooth_l1 knees, zero
probabilities, dominant classes, log Z near 0. Focal, bce and class-index cross-entropy:
tests/test_oracle_edges.py.

The bound: |got − want| ≤ 1e-12·|want| + 16u·scale (u = 2^−53), scale the size of the terms a float
evaluation combines (tools/_mp_refs.py): relative where nothing cancels; where terms cancel (x − y,
p·log p − p·x at p = e^x, p_k·Σwq − w_k·q_k near the optimum) no float64 formula does better than
that absolute share. Below the smallest normal number (2.2e-308) values have absolute precision
only, so the relative part is taken of that floor; true values beyond float64's range are not
compared. Negative controls: a
planted error of one part in 1e10 on each family, and a cancelling log-softmax, are flagged."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config.loss import LossSpec
from conformance.harness.backends import Backend
from conformance.oracle import losses as oracle

_spec = importlib.util.spec_from_file_location("_mp_refs", Path(__file__).resolve().parents[1] / "tools" / "_mp_refs.py")
refs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refs)

U = 2.0**-53
BIG = float(np.finfo(np.float64).max)
TINY = float(np.finfo(np.float64).tiny)  # the smallest normal: below it values hold absolute precision only
FRAMEWORKS = ["oracle", "torch", "jax"]
Evaluate = Callable[[LossSpec, np.ndarray, np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray]]


def evaluate(framework: str) -> Evaluate:
    """(value per element, d(Σ value)/dx) of a framework's loss_value_and_grad, reduction "none"."""
    def run(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if framework == "oracle":
            out = oracle.loss_value_and_grad(spec, x, y, w)
        else:
            backend = Backend(framework)
            with backend.context():
                out = backend.function("losses", "loss_value_and_grad")(spec, x, y, w)
        return np.asarray(out["value"], np.float64), np.asarray(out["grad"], np.float64)
    return run


def flushed(framework: str, *values: float) -> bool:
    """Whether JAX's eager XLA:CPU flushes one of these inputs to 0 (a subnormal: L-FTZ)."""
    return framework == "jax" and any(0 < abs(v) < TINY for v in values)


def misses(got: float, want: Any, scale: Any) -> float:
    """How far past the bound `got` is (≤ 1: within it); 0 where the true value is beyond float64."""
    if abs(want) > BIG:
        return 0.0
    if not np.isfinite(got):
        return float("inf")
    if isinstance(want, Fraction):  # exact references stay exact
        err, bound = abs(Fraction(float(got)) - want), 1e-12 * max(abs(want), Fraction(TINY)) + 16 * U * scale
    else:
        err, bound = abs(mp.mpf(float(got)) - want), 1e-12 * max(abs(want), TINY) + 16 * U * scale
    return float(err / bound)


# --- mse, l1, huber, smooth_l1 (exact) ---------------------------------------------------------------
REGRESSION = [("mse", 1.0), ("l1", 1.0), ("huber", 1.0), ("huber", 1e-3), ("huber", 50.0), ("smooth_l1", 1.0),
              ("smooth_l1", 1e-3), ("smooth_l1", 0.0)]
EDGES = [(0.0, 0.0), (5e-324, 0.0), (1e-300, -1e-300), (1e150, -1e150), (1e300, 1e300 * (1 - 2**-52)),
         (1.0 + 2**-52, 1.0), (3.0, 2.0), (2.0, 3.0), (-1e-3, 0.0), (50.0, 0.0), (0.5e-3, 0.0), (1e-3, 2e-3)]


def regression_worst(run: Evaluate, name: str, param: float, points: list[tuple[float, float]]) -> float:
    key = {"huber": "delta", "smooth_l1": "beta"}.get(name)
    spec = LossSpec(name=name, reduction="none", **({key: param} if key else {}))
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    with np.errstate(over="ignore", invalid="ignore"):
        value, grad = run(spec, x, y, None)
    out = 0.0
    for i, (xi, yi) in enumerate(points):
        v, g, vs, gs = refs.regression(name, xi, yi, param)
        out = max(out, misses(value[i], v, vs), misses(grad[i], g, gs))
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize(("name", "param"), REGRESSION)
def test_regression_at_the_edges(framework: str, name: str, param: float) -> None:
    knees = [(param * f, 0.0) for f in (1.0, 1 - 2**-52, 1 + 2**-52, 0.5)] if param else []
    points = [(x, y) for x, y in EDGES + knees if not flushed(framework, x, y, x - y)]
    assert regression_worst(evaluate(framework), name, param, points) <= 1


@settings(max_examples=40, deadline=None, derandomize=True)
@given(case=st.sampled_from(REGRESSION), x=st.floats(-1e200, 1e200), y=st.floats(-1e200, 1e200))
def test_regression_anywhere(case: tuple[str, float], x: float, y: float) -> None:
    for framework in [f for f in FRAMEWORKS if not flushed(f, x, y, x - y)]:
        assert regression_worst(evaluate(framework), *case, [(x, y)]) <= 1, framework


# --- kl_div ------------------------------------------------------------------------------------------
KL_POINTS = [(-2.0, 0.3), (np.log(0.3), 0.3), (-700.0, 1e-300), (0.0, 0.0), (-1.0, 5e-324), (30.0, 1.0),
             (-50.0, 1e-20), (-1e-10, 1.0)]
LOG_POINTS = [(-2.0, np.log(0.3)), (np.log(0.3), np.log(0.3)), (-700.0, -690.0), (10.0, -745.0), (-1.0, 0.0)]


def kl_worst(run: Evaluate, points: list[tuple[float, float]], log_target: bool) -> float:
    spec = LossSpec(name="kl_div", reduction="none", log_target=log_target)
    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    value, grad = run(spec, x, y, None)
    out = 0.0
    for i, (xi, yi) in enumerate(points):
        v, g, vs, gs = refs.kl_div(xi, yi, log_target)
        out = max(out, misses(value[i], v, vs), misses(grad[i], g, gs))
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_kl_div_at_the_edges(framework: str) -> None:
    assert kl_worst(evaluate(framework), [p for p in KL_POINTS if not flushed(framework, *p)], False) <= 1
    assert kl_worst(evaluate(framework), [p for p in LOG_POINTS if not flushed(framework, *p, math.exp(p[1]))],
                    True) <= 1


@settings(max_examples=40, deadline=None, derandomize=True)
@given(x=st.floats(-740, 700), p=st.floats(0.0, 1.0), logp=st.floats(-740, 5))
def test_kl_div_anywhere(x: float, p: float, logp: float) -> None:
    for framework in FRAMEWORKS:
        run = evaluate(framework)
        if not flushed(framework, x, p):
            assert kl_worst(run, [(x, p)], False) <= 1, framework
        if not flushed(framework, x, logp, logp - x, math.exp(logp)):  # e^y subnormal: flushed too
            assert kl_worst(run, [(x, logp)], True) <= 1, framework


# --- cross_entropy: probabilities, smoothing, class weights, z-loss --------------------------------
Row = tuple[list[float], Any, float, list[float] | None, float]  # logits, target, ε, weights, z
ROWS: list[Row] = [
    ([0.5, -0.25, 2.0], [0.2, 0.3, 0.5], 0.0, None, 0.0),
    ([40.0, 0.0, -3.0], [1.0, 0.0, 0.0], 0.0, None, 0.0),  # a dominant class, probability targets
    ([40.0, 0.0, -3.0], 0, 0.1, [2.0, 0.5, 1.0], 1e-4),
    ([-np.log(2.0), -np.log(2.0)], [0.5, 0.5], 0.0, None, 0.5),  # log Z ≈ 0: the z term cancels
    ([1.0, 2.0, 3.0], 2, 0.9, None, 0.5),
    ([300.0, -300.0, 0.0], [0.0, 0.0, 1.0], 0.2, [1.0, 3.0, 0.25], 1e-4),
    ([0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], 0.0, None, 0.0),
]


def ce_worst(run: Evaluate, rows: list[Row], twin: bool = False) -> float:
    """The worst miss over the rows; `twin`: torch's log-softmax, (x − m) − log Σ e^(x − m), whose log
    of a sum near 1 is off by u absolutely in every log p_c (L-BCE-SAT), adds u·Σ_c w_c·q'_c."""
    out = 0.0
    for x, target, eps, weight, z in rows:
        spec = LossSpec(name="cross_entropy", reduction="none", label_smoothing=eps, z_loss=z)
        y = np.array([target]) if isinstance(target, int) else np.array([target], np.float64)
        w = None if weight is None else np.array(weight)
        value, grad = run(spec, np.array([x]), y, w)
        v, g, vs, gs = refs.cross_entropy_row(x, target, eps, weight, z)
        if twin:
            q = [float(c == target) for c in range(len(x))] if isinstance(target, int) else target
            vs += sum((1.0 if weight is None else weight[c]) * ((1 - eps) * q[c] + eps / len(x))
                      for c in range(len(x))) / 16
        out = max(out, misses(value[0], v, vs), *(misses(a, b, s) for a, b, s in zip(grad[0], g, gs)))
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_cross_entropy_at_the_edges(framework: str) -> None:
    assert ce_worst(evaluate(framework), ROWS, twin=framework != "oracle") <= 1


@st.composite
def rows(draw: Any) -> Row:
    n = draw(st.integers(2, 5))
    x = draw(st.lists(st.floats(-60, 60) | st.sampled_from([-300.0, 300.0, 0.0]), min_size=n, max_size=n))
    if draw(st.booleans()):
        target: Any = draw(st.integers(0, n - 1))
    else:
        raw = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
        total = sum(raw)
        target = [r / total for r in raw] if total > 0 else [1.0 / n] * n
    weight = draw(st.none() | st.lists(st.floats(0.1, 10.0), min_size=n, max_size=n))
    return x, target, draw(st.sampled_from([0.0, 0.1, 0.9])), weight, draw(st.sampled_from([0.0, 1e-4, 0.5]))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(row=rows())
def test_cross_entropy_anywhere(row: Row) -> None:
    for framework in [f for f in FRAMEWORKS if not flushed(f, *row[0])]:
        assert ce_worst(evaluate(framework), [row], twin=framework != "oracle") <= 1, framework


# --- negative controls: the bound sees a relative error of 1e-10, and a cancelling log-softmax ---------
def _planted(run: Evaluate) -> Evaluate:
    def off(spec: LossSpec, x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        value, grad = run(spec, x, y, w)
        return value * (1 + 1e-10), grad
    return off


def test_negative_control_a_relative_error_of_1e_10_is_flagged_in_every_family() -> None:
    planted = _planted(evaluate("oracle"))
    assert regression_worst(planted, "huber", 1.0, [(3.0, 2.0)]) > 1
    assert kl_worst(planted, [(-2.0, 0.3)], False) > 1
    assert ce_worst(planted, ROWS[:1]) > 1


def test_negative_control_a_cancelling_log_softmax_is_flagged_on_probability_targets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def cancelling(x: np.ndarray) -> np.ndarray:  # x − (m + log Σ exp(x − m)): log p = 0 for a dominant class
        top = x.max(axis=-1, keepdims=True)
        return x - (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))

    monkeypatch.setattr(oracle, "log_softmax", cancelling)
    assert ce_worst(evaluate("oracle"), ROWS[:1]) <= 1  # fine where nothing cancels
    assert ce_worst(evaluate("oracle"), ROWS[1:2]) > 1  # −log p = 0, not e^−40
