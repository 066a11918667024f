"""Losses: torch == jax == oracle on random shapes and options; algebraic properties of (sum, count)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.config.loss import LossSpec
from conformance.errors import InputError
from conformance.harness.arrays import round_to
from conformance.harness.backends import Backend
from conformance.harness.compare import compare
from conformance.rules.tolerance import default_tolerance

FRAMEWORKS = ("torch", "jax")


def evaluate(backend: str, spec: LossSpec, dtype: str = "float64", **arrays) -> dict:
    b = Backend(backend)
    with b.context():
        return b.function("losses", "loss_value_and_grad")(spec, dtype=dtype, **arrays)


@st.composite
def loss_problem(draw):
    """A random loss spec with matching inputs (shapes 1-3 dims, every option of the chosen loss)."""
    name = draw(st.sampled_from(["mse", "l1", "cross_entropy", "nll", "bce_with_logits", "huber",
                                 "smooth_l1", "kl_div"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    reduction = draw(st.sampled_from(["mean", "sum", "none"] + (["batchmean"] if name == "kl_div" else [])))
    kw: dict = {"name": name, "reduction": reduction}
    use_mask = draw(st.booleans()) and reduction != "batchmean"
    if name in ("cross_entropy", "nll"):
        n, c = draw(st.integers(1, 5)), draw(st.integers(2, 5))
        extra = draw(st.sampled_from([(), (3,)]))
        x = rng.normal(size=(n, c, *extra)) * 3
        if name == "nll":
            x = x - np.log(np.exp(x).sum(1, keepdims=True))
        probs = name == "cross_entropy" and draw(st.booleans())
        if probs:
            y = np.moveaxis(rng.dirichlet(np.ones(c), (n, *extra)), -1, 1)
        else:
            y = rng.integers(0, c, (n, *extra))
            y = np.where(rng.random(y.shape) < 0.3, -100, y)
            y.flat[0] = 0  # at least one valid target
        if draw(st.booleans()):
            kw["weight"] = rng.uniform(0.2, 2.0, c).round(3).tolist()
        if name == "cross_entropy":
            kw["label_smoothing"] = draw(st.sampled_from([0.0, 0.1, 0.5]))
        el_shape = (n, *extra)
    else:
        shape = draw(st.sampled_from([(4,), (3, 2), (2, 3, 2)]))
        x = rng.normal(size=shape) * 2
        el_shape = shape
        if name == "bce_with_logits":
            y = rng.uniform(0, 1, shape)
            if draw(st.booleans()):
                kw["pos_weight"] = rng.uniform(0.5, 2.0, shape[-1]).round(3).tolist()
            if draw(st.booleans()):
                kw["weight"] = rng.uniform(0.2, 2.0, shape[-1]).round(3).tolist()
        elif name == "kl_div":
            kw["log_target"] = draw(st.booleans())
            x = np.log(rng.dirichlet(np.ones(shape[-1]), shape[:-1]))
            y = rng.dirichlet(np.ones(shape[-1]), shape[:-1])
            y = np.log(y) if kw["log_target"] else y
        else:
            y = rng.normal(size=shape) * 2
            if name == "huber":
                kw["delta"] = draw(st.sampled_from([0.5, 1.0, 2.0]))
            if name == "smooth_l1":
                kw["beta"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
    mask = None
    if use_mask:
        mask = rng.random(el_shape) < 0.7
        mask.flat[0] = True
    return LossSpec(**kw), {"prediction": x, "target": y, "mask": mask}


def _tolerance(dtype: str) -> tuple[float, float]:
    return default_tolerance(dtype)


@given(loss_problem(), st.sampled_from(["float64", "float32"]))
def test_frameworks_match_oracle(problem, dtype: str) -> None:
    spec, arrays = problem
    arrays = {k: v if v is None or v.dtype == bool or np.issubdtype(v.dtype, np.integer) else round_to(v, dtype)
              for k, v in arrays.items()}
    want = evaluate("oracle", spec, **arrays)
    atol, rtol = _tolerance(dtype)
    for fw in FRAMEWORKS:
        got = evaluate(fw, spec, dtype, **arrays)
        for key in ("value", "grad", "sum", "count"):
            # float32 sums over more terms: scale the bound by the magnitude being summed
            scale = 1.0 if dtype == "float64" else max(1.0, float(np.abs(want[key]).max()))
            res = compare(got[key], want[key], atol * scale, rtol)
            assert res.passed, f"{fw} {key} ({spec}): {res.message}"


@given(loss_problem())
def test_mean_is_sum_over_count(problem) -> None:
    spec, arrays = problem
    if spec.reduction == "batchmean":
        return
    for fw in FRAMEWORKS:
        mean = evaluate(fw, spec.model_copy(update={"reduction": "mean"}), **arrays)
        total = evaluate(fw, spec.model_copy(update={"reduction": "sum"}), **arrays)
        assert mean["count"] == total["count"]
        np.testing.assert_allclose(mean["value"] * mean["count"], total["value"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(mean["grad"] * mean["count"], total["grad"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
@given(seed=st.integers(0, 2**31 - 1), eps=st.sampled_from([0.0, 0.1, 0.3]))
def test_label_smoothing_equals_smoothed_one_hot(backend_name: str, seed: int, eps: float) -> None:
    """Index targets with smoothing ε equal probability targets (1-ε)·onehot + ε/C; ε = 0 is plain CE."""
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(5, 4)), rng.integers(0, 4, 5)
    idx = evaluate(backend_name, LossSpec(name="cross_entropy", label_smoothing=eps), prediction=x, target=y)
    onehot = np.eye(4)[y]
    prob = evaluate(backend_name, LossSpec(name="cross_entropy", label_smoothing=eps), prediction=x, target=onehot)
    np.testing.assert_allclose(idx["value"], prob["value"], rtol=1e-13)
    np.testing.assert_allclose(idx["grad"], prob["grad"], atol=1e-15)
    if eps == 0:
        plain = evaluate(backend_name, LossSpec(name="cross_entropy"), prediction=x, target=y)
        assert float(plain["value"]) == float(idx["value"])


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
@given(seed=st.integers(0, 2**31 - 1), weighted=st.booleans(), eps=st.sampled_from([0.0, 0.2]))
def test_ignored_rows_contribute_nothing(backend_name: str, seed: int, weighted: bool, eps: float) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(6, 3)), rng.integers(0, 3, 6)
    y[[1, 4]] = -100
    spec = LossSpec(name="cross_entropy", label_smoothing=eps,
                    weight=rng.uniform(0.5, 2, 3).tolist() if weighted else None)
    base = evaluate(backend_name, spec, prediction=x, target=y)
    x2 = x.copy()
    x2[[1, 4]] = rng.normal(size=(2, 3)) * 50  # whatever the ignored rows predict
    moved = evaluate(backend_name, spec, prediction=x2, target=y)
    assert float(base["value"]) == pytest.approx(float(moved["value"]), rel=1e-14)
    assert np.all(base["grad"][[1, 4]] == 0) and np.all(moved["grad"][[1, 4]] == 0)
    kept = evaluate(backend_name, spec, prediction=np.delete(x, [1, 4], 0), target=np.delete(y, [1, 4]))
    assert float(base["value"]) == pytest.approx(float(kept["value"]), rel=1e-13)


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
def test_masked_elements_contribute_nothing(backend_name: str) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    mask = np.array([[True, False, True]] * 4)
    spec = LossSpec(name="mse")
    full = evaluate(backend_name, spec, prediction=x[:, [0, 2]], target=y[:, [0, 2]])
    part = evaluate(backend_name, spec, prediction=x, target=y, mask=mask)
    assert float(full["value"]) == pytest.approx(float(part["value"]), rel=1e-14)
    assert part["count"] == 8.0 and np.all(part["grad"][:, 1] == 0)


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
def test_same_input_error_on_every_backend(backend_name: str) -> None:
    spec = LossSpec(name="cross_entropy")
    with pytest.raises(InputError, match=r"target 7 at index \(1\) is out of range for 3 classes"):
        evaluate(backend_name, spec, prediction=np.zeros((2, 3)), target=np.array([0, 7]))
