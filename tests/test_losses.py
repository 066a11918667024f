"""Losses: torch == jax == oracle on random shapes and options; algebraic properties of (sum, count)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.config.loss import LossSpec
from conformance.errors import InputError
from conformance.harness.arrays import round_to
from conformance.harness.backends import Backend
from conformance.harness.compare import compare
from conformance.rules.inputs import NEG_INF_LOSSES
from conformance.rules.tolerance import default_tolerance

FRAMEWORKS = ("torch", "jax")


def evaluate(backend: str, spec: LossSpec, dtype: str = "float64", **arrays) -> dict:
    b = Backend(backend)
    with b.context():
        return b.function("losses", "loss_value_and_grad")(spec, dtype=dtype, **arrays)


def _neg_inf(rng: np.random.Generator, x: np.ndarray, cdim: int | None) -> np.ndarray:
    """Set ~30% of the logits to -inf (probability 0), keeping one finite class per row when the
    classes are on `cdim` (a row of all -inf is refused)."""
    x = np.where(rng.random(x.shape) < 0.3, -np.inf, x)
    if cdim is not None:
        z = np.moveaxis(x, cdim, -1)
        keep = rng.integers(0, z.shape[-1], z.shape[:-1])
        np.put_along_axis(z, keep[..., None], rng.normal(size=z.shape[:-1] + (1,)), -1)
        x = np.moveaxis(z, -1, cdim)
    return x


def _mask(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    mask = rng.random(shape) < 0.7
    mask.flat[0] = True
    return {"bool": mask, "float": mask.astype(np.float64), "int": mask.astype(np.int64)}[kind]


@st.composite
def loss_problem(draw):
    """A random loss spec with matching inputs (shapes 1-3 dims, every option of the chosen loss):
    -inf logits where a loss accepts them, boolean or 0/1 masks, broadcast pos_weight, sample weights."""
    name = draw(st.sampled_from(["mse", "l1", "cross_entropy", "nll", "bce_with_logits", "huber",
                                 "smooth_l1", "kl_div", "sigmoid_focal"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    reduction = draw(st.sampled_from(["mean", "sum", "none"] + (["batchmean"] if name == "kl_div" else [])))
    kw: dict = {"name": name, "reduction": reduction}
    use_mask = draw(st.booleans()) and reduction != "batchmean"
    neg_inf = draw(st.booleans()) and name in NEG_INF_LOSSES
    if name in ("cross_entropy", "nll"):
        n, c = draw(st.integers(1, 5)), draw(st.integers(2, 5))
        extra = draw(st.sampled_from([(), (3,)]))
        x = rng.normal(size=(n, c, *extra)) * 3
        if name == "nll":
            x = x - np.log(np.exp(x).sum(1, keepdims=True))
        if neg_inf:
            x = _neg_inf(rng, x, 1 if name == "cross_entropy" else None)
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
        if name in ("bce_with_logits", "sigmoid_focal"):
            y = rng.uniform(0, 1, shape) if draw(st.booleans()) else (rng.random(shape) < 0.5).astype(float)
            if name == "bce_with_logits":
                x = _neg_inf(rng, x, None) if neg_inf else x
                pw = draw(st.sampled_from(["none", "last", "one", "number", "column"]))
                full = rng.uniform(0.5, 2.0, shape).round(3)
                kw["pos_weight"] = {"none": None, "last": full.reshape(-1)[:shape[-1]].tolist(), "one": [2.5],
                                    "number": 0.5, "column": full[..., :1].reshape(-1, 1)[:shape[-2]].tolist()
                                    if len(shape) >= 2 else [1.5]}[pw]
            else:
                kw["alpha"] = draw(st.sampled_from([-1.0, 0.0, 0.25, 0.5, 1.0]))
                kw["gamma"] = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))
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
    mask = _mask(rng, el_shape, draw(st.sampled_from(["bool", "float", "int"]))) if use_mask else None
    sample_weight = None
    if draw(st.booleans()):
        lead = el_shape[:draw(st.integers(0, len(el_shape)))]
        sample_weight = np.where(rng.random(lead) < 0.2, 0.0, rng.uniform(0, 2, lead).round(3))
    return LossSpec(**kw), {"prediction": x, "target": y, "mask": mask, "sample_weight": sample_weight}


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
            # float32 sums over more terms: scale the bound by the (finite) magnitude being summed
            finite = np.abs(np.asarray(want[key], np.float64))[np.isfinite(want[key])]
            scale = 1.0 if dtype == "float64" or finite.size == 0 else max(1.0, float(finite.max()))
            res = compare(got[key], want[key], atol * scale, rtol)
            assert res.passed, f"{fw} {key} ({spec}): {res.message}"
        # -inf logits: the gradient is finite wherever the prediction is not +inf/NaN (torch's)
        assert np.all(np.isfinite(got["grad"])), f"{fw}: non-finite gradient ({spec})"


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


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["cross_entropy", "bce_with_logits", "sigmoid_focal"]))
def test_float_and_integer_masks_select_as_boolean_masks(backend_name: str, seed: int, name: str) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(5, 3))
    y = rng.integers(0, 3, 5) if name == "cross_entropy" else rng.uniform(0, 1, (5, 3))
    mask = _mask(rng, (5,) if name == "cross_entropy" else (5, 3), "bool")
    spec = LossSpec(name=name)
    want = evaluate(backend_name, spec, prediction=x, target=y, mask=mask)
    for kind in (np.float64, np.float32, np.int64):
        got = evaluate(backend_name, spec, prediction=x, target=y, mask=mask.astype(kind))
        assert all(np.array_equal(got[k], want[k]) for k in ("value", "grad", "sum", "count"))


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(["cross_entropy", "mse", "bce_with_logits"]))
def test_sample_weight_multiplies_the_per_sample_loss(backend_name: str, seed: int, name: str) -> None:
    """sum = Σ s·ℓ over the per-element values; the mean divides that by the unchanged count; ones = none."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(6, 3))
    y = rng.integers(0, 3, 6) if name == "cross_entropy" else rng.uniform(0, 1, (6, 3))
    spec = LossSpec(name=name, weight=[0.5, 1.0, 2.0] if name != "mse" else None)
    s = rng.uniform(0, 2, 6).round(3)
    per = evaluate(backend_name, spec.model_copy(update={"reduction": "none"}), prediction=x, target=y)
    s_b = s.reshape((6,) + (1,) * (per["value"].ndim - 1))
    mean = evaluate(backend_name, spec, prediction=x, target=y, sample_weight=s)
    assert mean["count"] == per["count"]
    np.testing.assert_allclose(mean["sum"], float((s_b * per["value"]).sum()), rtol=1e-13)
    np.testing.assert_allclose(mean["value"], float((s_b * per["value"]).sum()) / per["count"], rtol=1e-13)
    plain = evaluate(backend_name, spec, prediction=x, target=y)
    ones = evaluate(backend_name, spec, prediction=x, target=y, sample_weight=np.ones(6))
    # torch sums the class losses inside nll_loss (one kernel, its own summation order): the 6 positive
    # float64 terms summed in another order differ by at most 5 ulp-scale roundings (5 * 2**-53 relative,
    # 5.6e-16) and the mean adds one more; counts and gradients are order-free. Bit for bit elsewhere.
    for k in ("value", "grad", "sum", "count"):
        np.testing.assert_allclose(ones[k], plain[k], rtol=1e-15 if backend_name == "torch" else 0, atol=0)


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
def test_sample_weight_equals_keras(backend_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keras 3's own losses with sample_weight (reduction sum_over_batch_size) give twinstep's mean."""
    if "KERAS_BACKEND" not in os.environ:
        monkeypatch.setenv("KERAS_BACKEND", "jax")  # read once, when keras is first imported
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(7)
    x, s = rng.normal(size=(6, 4)), np.array([1.0, 0.0, 0.5, 2.0, 1.5, 0.25])
    labels, probs = rng.integers(0, 4, 6), rng.uniform(0, 1, (6, 4))
    pairs = [
        (keras.losses.SparseCategoricalCrossentropy(from_logits=True), LossSpec(name="cross_entropy"), labels),
        (keras.losses.MeanSquaredError(), LossSpec(name="mse"), probs),
        (keras.losses.BinaryCrossentropy(from_logits=True), LossSpec(name="bce_with_logits"), probs),
    ]
    for fn, spec, y in pairs:
        want = float(keras.ops.convert_to_numpy(fn(y.astype(np.float32) if y.dtype != np.int64 else y,
                                                  x.astype(np.float32), sample_weight=s.astype(np.float32))))
        got = evaluate(backend_name, spec, prediction=x, target=y, sample_weight=s)
        assert float(got["value"]) == pytest.approx(want, rel=2e-6), spec.name


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
def test_pos_weight_broadcasts_as_torch(backend_name: str) -> None:
    """[2.5], a number and a [C, 1] column mean what the full per-element pos_weight means."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 3, 4)), rng.uniform(0, 1, (2, 3, 4))
    full = evaluate(backend_name, LossSpec(name="bce_with_logits", pos_weight=np.full(4, 2.5).tolist()),
                    prediction=x, target=y)
    for pw in ([2.5], 2.5, [[2.5]] * 3):
        got = evaluate(backend_name, LossSpec(name="bce_with_logits", pos_weight=pw), prediction=x, target=y)
        np.testing.assert_allclose(got["value"], full["value"], rtol=1e-15)
        np.testing.assert_allclose(got["grad"], full["grad"], rtol=1e-15)
    col = [[0.5], [1.0], [2.0]]
    got = evaluate(backend_name, LossSpec(name="bce_with_logits", pos_weight=col), prediction=x, target=y)
    per_class = [evaluate(backend_name, LossSpec(name="bce_with_logits", pos_weight=c, reduction="sum"),
                          prediction=x[:, i], target=y[:, i])["value"] for i, c in enumerate(col)]
    np.testing.assert_allclose(float(got["sum"]), float(sum(per_class)), rtol=1e-14)
    with pytest.raises(InputError, match=r"pos_weight shape \(3,\) does not broadcast to the prediction shape \(2, 3, 4\)"):
        evaluate(backend_name, LossSpec(name="bce_with_logits", pos_weight=[1.0, 2.0, 3.0]), prediction=x, target=y)


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
@given(seed=st.integers(0, 2**31 - 1))
def test_focal_reduces_to_bce(backend_name: str, seed: int) -> None:
    """gamma = 0 without alpha is bce_with_logits; alpha = 1/2 halves it (torchvision's formula)."""
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(4, 3)) * 3, rng.uniform(0, 1, (4, 3))
    bce = evaluate(backend_name, LossSpec(name="bce_with_logits", reduction="none"), prediction=x, target=y)
    for alpha, factor in ((-1.0, 1.0), (0.5, 0.5)):
        f = evaluate(backend_name, LossSpec(name="sigmoid_focal", alpha=alpha, gamma=0.0, reduction="none"),
                     prediction=x, target=y)
        np.testing.assert_allclose(f["value"], factor * bce["value"], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(f["grad"], factor * bce["grad"], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
def test_neg_inf_target_class_gives_inf_with_finite_gradient(backend_name: str) -> None:
    x = np.array([[0.5, -np.inf, 1.0], [0.2, 0.1, -np.inf]])
    out = evaluate(backend_name, LossSpec(name="cross_entropy"), prediction=x, target=np.array([1, 0]))
    assert float(out["value"]) == np.inf and np.all(np.isfinite(out["grad"]))
    masked = evaluate(backend_name, LossSpec(name="cross_entropy"), prediction=x, target=np.array([1, 0]),
                      mask=np.array([0.0, 1.0]))
    assert np.isfinite(float(masked["value"])) and masked["count"] == 1.0
