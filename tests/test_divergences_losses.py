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
