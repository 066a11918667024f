"""Pins of the loss differences between torch.nn.functional and optax.losses (docs/divergences.md).

Each test asserts what the frameworks themselves do today; if either changes, the test fails and
the divergence entry (and twinstep's recipe for it) must be revisited.
"""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

X = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 0.25]])


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def test_l2_loss_is_half_of_mse() -> None:
    """L-MSE: optax.l2_loss = 0.5·(x−y)²; torch MSELoss = (x−y)²."""
    y = np.zeros_like(X)
    mse = F.mse_loss(torch.tensor(X), torch.tensor(y)).item()
    l2 = float(jnp.mean(optax.losses.l2_loss(jnp.asarray(X), jnp.asarray(y))))
    assert l2 == pytest.approx(0.5 * mse, rel=1e-15)
    assert float(jnp.mean(optax.losses.squared_error(jnp.asarray(X), jnp.asarray(y)))) == pytest.approx(mse, rel=1e-15)


def test_out_of_range_labels() -> None:
    """L-LABELS: torch raises on label C or −1; optax returns NaN for C and −100, and wraps −1 to C−1."""
    logits = jnp.asarray(X[:1])
    ce = optax.losses.softmax_cross_entropy_with_integer_labels
    assert np.isnan(float(ce(logits, jnp.array([3]))[0]))
    assert np.isnan(float(ce(logits, jnp.array([-100]))[0]))
    assert float(ce(logits, jnp.array([-1]))[0]) == float(ce(logits, jnp.array([2]))[0])
    for bad in (3, -1):
        with pytest.raises(IndexError):
            F.cross_entropy(torch.tensor(X[:1]), torch.tensor([bad]))


def test_ignore_index_only_in_torch() -> None:
    """L-IGNORE: torch skips −100 targets (and returns NaN when all are ignored); optax has no ignore_index."""
    assert "ignore_index" not in inspect.signature(optax.losses.softmax_cross_entropy_with_integer_labels).parameters
    assert torch.isnan(F.cross_entropy(torch.tensor(X), torch.tensor([-100, -100])))
    both = F.cross_entropy(torch.tensor(X), torch.tensor([2, -100])).item()
    assert both == pytest.approx(F.cross_entropy(torch.tensor(X[:1]), torch.tensor([2])).item(), rel=1e-15)


def test_smooth_l1_is_huber_over_beta_and_beta_zero() -> None:
    """L-SMOOTHL1: SmoothL1(β) = huber(δ=β)/β; β = 0 is L1 in torch, while optax huber(δ=0) is 0."""
    e = jnp.asarray([0.3, -2.0, 0.8])
    for beta in (0.5, 2.0):
        t = F.smooth_l1_loss(torch.tensor(np.asarray(e)), torch.zeros(3, dtype=torch.float64), beta=beta).item()
        o = float(jnp.mean(optax.losses.huber_loss(e, jnp.zeros(3), delta=beta))) / beta
        assert t == pytest.approx(o, rel=1e-15)
    assert float(jnp.sum(optax.losses.huber_loss(e, jnp.zeros(3), delta=0.0))) == 0.0
    l1 = F.smooth_l1_loss(torch.tensor(np.asarray(e)), torch.zeros(3, dtype=torch.float64), beta=0.0).item()
    assert l1 == pytest.approx(float(jnp.mean(jnp.abs(e))), rel=1e-15)


def test_kl_mean_divides_by_every_element() -> None:
    """L-KLMEAN: torch 'mean' divides by B·C; optax.kl_divergence sums the class axis ('batchmean')."""
    p = np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    logq = np.log(np.array([[0.3, 0.3, 0.4], [0.2, 0.5, 0.3]]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mean = F.kl_div(torch.tensor(logq), torch.tensor(p), reduction="mean").item()
    batchmean = F.kl_div(torch.tensor(logq), torch.tensor(p), reduction="batchmean").item()
    optax_kl = float(jnp.mean(optax.losses.kl_divergence(jnp.asarray(logq), jnp.asarray(p))))
    assert optax_kl == pytest.approx(batchmean, rel=1e-14)
    assert optax_kl / 3 == pytest.approx(mean, rel=1e-14)


def test_bce_pos_weight_only_in_torch() -> None:
    """L-POSWEIGHT: optax.sigmoid_binary_cross_entropy has no pos_weight (twinstep writes it out)."""
    assert "pos_weight" not in inspect.signature(optax.losses.sigmoid_binary_cross_entropy).parameters
    assert "pos_weight" in inspect.signature(F.binary_cross_entropy_with_logits).parameters


def test_torch_broadcasts_mismatched_regression_shapes() -> None:
    """L-BROADCAST: torch broadcasts prediction [N, 1] against target [N] to [N, N] with only a warning."""
    pred, target = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([1.0, 2.0, 3.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = F.mse_loss(pred, target).item()
    assert any("broadcast" in str(w.message) for w in caught)
    assert value == pytest.approx(12 / 9, rel=1e-6)  # mean of (x_i - y_j)² over the 3×3 broadcast, not 0


def test_cross_entropy_class_axis() -> None:
    """L-AXIS: torch's classes are on dim 1 of (N, C, d…); optax's are on the last axis."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 4, 3)), rng.integers(0, 4, (2, 3))
    t = F.cross_entropy(torch.tensor(x), torch.tensor(y), reduction="none").numpy()
    o = np.asarray(optax.losses.softmax_cross_entropy_with_integer_labels(jnp.moveaxis(jnp.asarray(x), 1, -1),
                                                                         jnp.asarray(y)))
    np.testing.assert_allclose(t, o, rtol=1e-14)


NINF = -np.inf


def _torch_value_grad(fn, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xt = torch.tensor(x, requires_grad=True)
    v = fn(xt)
    v.sum().backward()
    return v.detach().numpy(), xt.grad.numpy()


def _optax_value_grad(fn, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = fn(jnp.asarray(x))
    return np.asarray(v), np.asarray(jax.grad(lambda a: fn(a).sum())(jnp.asarray(x)))


def test_neg_inf_logits_in_torch_and_optax() -> None:
    """L-NEGINF: with class indices both give +inf where the target's class is -inf and finite gradients;
    probability targets are NaN at a -inf class with q = 0 in both (optax.safe_softmax_cross_entropy
    gives 0·log 0 = 0 instead); at a -inf logit torch's bce is NaN for every target, optax's NaN for y = 0
    and +inf for y > 0, with the same finite gradient."""
    x = np.array([[1.0, NINF, 0.5], [0.2, 0.3, NINF]])
    y = np.array([1, 0])
    tv, tg = _torch_value_grad(lambda a: F.cross_entropy(a, torch.tensor(y), reduction="none"), x)
    ov, og = _optax_value_grad(lambda a: optax.losses.softmax_cross_entropy_with_integer_labels(a, jnp.asarray(y)), x)
    assert tv[0] == ov[0] == np.inf and tv[1] == pytest.approx(ov[1], rel=1e-15)
    np.testing.assert_allclose(tg, og, rtol=1e-15, atol=1e-16)
    q = np.array([[0.5, 0.0, 0.5], [0.2, 0.8, 0.0]])
    tv, tg = _torch_value_grad(lambda a: F.cross_entropy(a, torch.tensor(q), reduction="none"), x)
    ov, og = _optax_value_grad(lambda a: optax.losses.softmax_cross_entropy(a, jnp.asarray(q)), x)
    assert np.isnan(tv).all() and np.isnan(ov).all()
    np.testing.assert_allclose(tg, og, rtol=1e-14, atol=1e-16)
    safe = np.asarray(optax.losses.safe_softmax_cross_entropy(jnp.asarray(x), jnp.asarray(q)))
    assert np.isfinite(safe).all()
    xb, yb = np.full(3, NINF), np.array([0.0, 1.0, 0.5])
    tv, tg = _torch_value_grad(lambda a: F.binary_cross_entropy_with_logits(a, torch.tensor(yb), reduction="none"), xb)
    ov, og = _optax_value_grad(lambda a: optax.losses.sigmoid_binary_cross_entropy(a, jnp.asarray(yb)), xb)
    assert np.isnan(tv).all()
    assert np.isnan(ov[0]) and ov[1] == ov[2] == np.inf
    np.testing.assert_array_equal(tg, og)
    np.testing.assert_array_equal(tg, -yb)
    all_neg = np.array([[NINF, NINF]])  # no class with probability > 0: NaN in both (twinstep refuses it)
    assert torch.isnan(F.cross_entropy(torch.tensor(all_neg), torch.tensor([0]))).item()
    assert np.isnan(float(optax.losses.softmax_cross_entropy_with_integer_labels(jnp.asarray(all_neg),
                                                                                   jnp.asarray([0]))[0]))


def _torchvision_focal(x: torch.Tensor, y: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0) -> torch.Tensor:
    # torchvision.ops.sigmoid_focal_loss's formula, reduction "none" (tools/_loss_refs.py)
    p = torch.sigmoid(x)
    ce = F.binary_cross_entropy_with_logits(x, y, reduction="none")
    p_t = p * y + (1 - p) * (1 - y)
    loss = ce * ((1 - p_t) ** gamma)
    return (alpha * y + (1 - alpha) * (1 - y)) * loss if alpha >= 0 else loss


def test_optax_focal_has_no_alpha_by_default() -> None:
    """L-FOCAL: optax.sigmoid_focal_loss defaults to alpha = None (no weighting), torchvision to 0.25; with
    the same alpha they agree (optax computes (1 − p_t)^γ in log space: equal to rounding for moderate
    logits). At a -inf logit torchvision's formula is NaN with NaN gradients, optax's +inf for y > 0."""
    assert inspect.signature(optax.losses.sigmoid_focal_loss).parameters["alpha"].default is None
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 3)) * 3, (rng.random((4, 3)) > 0.5).astype(float)
    tv, tg = _torch_value_grad(lambda a: _torchvision_focal(a, torch.tensor(y)), x)
    ov, og = _optax_value_grad(lambda a: optax.losses.sigmoid_focal_loss(a, jnp.asarray(y), alpha=0.25), x)
    np.testing.assert_allclose(ov, tv, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(og, tg, rtol=1e-12, atol=1e-16)
    default = np.asarray(optax.losses.sigmoid_focal_loss(jnp.asarray(x), jnp.asarray(y)))
    tn, _ = _torch_value_grad(lambda a: _torchvision_focal(a, torch.tensor(y), alpha=-1), x)
    np.testing.assert_allclose(default, tn, rtol=1e-13, atol=1e-16)
    assert not np.allclose(default, tv)
    xb, yb = np.full(2, NINF), np.array([0.0, 1.0])
    tv, tg = _torch_value_grad(lambda a: _torchvision_focal(a, torch.tensor(yb)), xb)
    ov, og = _optax_value_grad(lambda a: optax.losses.sigmoid_focal_loss(a, jnp.asarray(yb), alpha=0.25), xb)
    assert np.isnan(tv).all() and np.isnan(tg).all()
    assert np.isnan(ov[0]) and ov[1] == np.inf and np.isnan(og).all()


def test_optax_focal_passes_the_focal_cases_with_torchvisions_alpha() -> None:
    """L-FOCAL ledger check: optax.sigmoid_focal_loss, with alpha mapped (-1 → None), passes every bundled
    sigmoid_focal case without weight, mask or sample weights; with optax's default alpha it fails them."""
    from conformance.harness.case import load_cases
    from conformance.harness.compare import compare

    cases = [c for c in load_cases(only=["loss/focal-*"]) if not c.expects_error and c.inputs.mask is None
             and c.inputs.sample_weight is None and c.sections["loss"].weight is None and c.dtype == "float64"]
    assert len(cases) >= 8
    for c in cases:
        spec, x, y = c.sections["loss"], c.inputs.prediction.astype(float), c.inputs.target.astype(float)
        reduce = {"none": lambda v: v, "sum": jnp.sum, "mean": jnp.mean}[spec.reduction]
        for alpha, should_pass in ((None if spec.alpha < 0 else spec.alpha, True), (None, spec.alpha < 0)):
            f = lambda a: reduce(optax.losses.sigmoid_focal_loss(a, jnp.asarray(y), alpha=alpha, gamma=spec.gamma))  # noqa: E731
            value = np.asarray(f(jnp.asarray(x)))
            grad = np.asarray(jax.grad(lambda a: f(a).sum())(jnp.asarray(x)))
            ok = compare({"value": value, "grad": grad}, {"value": c.expected.value, "grad": c.expected.grad},
                         c.atol, c.rtol).passed
            assert ok == should_pass, f"{c.id} alpha={alpha}"


def test_torchvisions_focal_loses_every_digit_at_saturated_logits() -> None:
    """L-FOCAL: torchvision's formula, step by step in torch, is NaN (gradient, γ < 1) or 0 (value) where
    1 − p_t or σ(x) − y cancels: it fails every loss/focal-saturated-* case (expected values from mpmath),
    which the twins and the oracle pass (tests/test_cases.py). Measured: float64 γ = 0.5, NaN gradients at
    x = 40 (y = 1) and x = 300; float32, value 0 and NaN gradient from x = 18 (y = 1) on."""
    from conformance.harness.case import load_cases
    from conformance.harness.compare import compare

    cases = load_cases(only=["loss/focal-saturated-*"])
    assert len(cases) == 3
    for c in cases:
        spec = c.sections["loss"]
        dtype = getattr(torch, c.dtype)
        y = torch.tensor(c.inputs.target, dtype=dtype)
        x = torch.tensor(c.inputs.prediction, dtype=dtype, requires_grad=True)
        value = _torchvision_focal(x, y, spec.alpha, spec.gamma)
        value.sum().backward()
        got = {"value": value.detach().double().numpy(), "grad": x.grad.double().numpy()}
        assert not compare(got, {"value": c.expected.value, "grad": c.expected.grad}, c.atol, c.rtol).passed, c.id
        if c.id != "loss/focal-saturated-soft-targets":  # soft targets keep 1 − p_t ≥ min(y, 1 − y): no 0^(γ−1)
            assert np.isnan(got["grad"]).any(), c.id
    want = _torch_value_grad(lambda a: _torchvision_focal(a, torch.tensor([1.0, 1.0]), 0.25, 0.5), np.array([40.0, 3.0]))
    assert np.isnan(want[1][0]) and np.isfinite(want[1][1])


def _torch_grad(loss, e: float, **kw) -> float:
    x = torch.tensor([e], dtype=torch.float64, requires_grad=True)
    loss(x, torch.zeros(1, dtype=torch.float64), **kw).backward()
    return float(x.grad[0])


def test_optax_huber_gradient_loses_small_residuals() -> None:
    """L-HUBER-GRAD: optax.huber_loss's |e| − min(|e|, δ) sends q + δ − δ back to |e|: the gradient
    is 0 at e = 1e-80 and off by u·δ at any e inside δ; torch's huber_loss backward is clamp(e, −δ, δ)."""
    slope = jax.grad(lambda e: optax.losses.huber_loss(e, 0.0, delta=1.0))
    assert float(slope(1e-80)) == 0.0 and _torch_grad(F.huber_loss, 1e-80) == 1e-80
    assert float(slope(1e-3)) != 1e-3 and _torch_grad(F.huber_loss, 1e-3) == 1e-3  # (1e-3 + 1) − 1
    assert float(slope(1.0)) == 1.0 and float(slope(2.5)) == 1.0  # exact at the knee and outside
    from ref_jax.losses import _huber  # the twin's form: the same values, torch's gradient

    assert float(jax.grad(lambda e: _huber(e, 0.0, 1.0))(1e-80)) == 1e-80


def test_jax_abs_gradient_at_zero_is_one() -> None:
    """L-L1-ZERO: jnp.abs's derivative at 0 is 1 (so an l1 gradient at a zero residual); torch's
    l1_loss (and sign) give 0. The twin writes |e| as e·sign(e): the same values, slope 0 at 0."""
    assert float(jax.grad(jnp.abs)(0.0)) == 1.0 and _torch_grad(F.l1_loss, 0.0) == 0.0
    from ref_jax.losses import _abs

    assert float(jax.grad(_abs)(0.0)) == 0.0


def test_eager_jax_on_the_cpu_flushes_subnormals() -> None:
    """L-FTZ: eager JAX operations on the CPU flush subnormal inputs and results to 0 (x·1 = 0 for
    x = 1e-310, 1e-160·1e-160 = 0); the same operations under jit, torch and NumPy keep them."""
    tiny = jnp.asarray([5e-324, 1e-310])
    assert np.asarray(tiny * 1.0).tolist() == [0.0, 0.0]
    assert np.asarray(jax.jit(lambda a: a * 1.0)(tiny)).tolist() == [5e-324, 1e-310]
    assert float(jnp.asarray(1e-160) * jnp.asarray(1e-160)) == 0.0
    assert (torch.tensor([5e-324, 1e-310], dtype=torch.float64) * 1.0).tolist() == [5e-324, 1e-310]
