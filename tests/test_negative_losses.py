"""Negative controls: the loss checks must catch a backend with a planted bug."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

from conformance.config.loss import LossSpec
from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case
from conformance.rules.inputs import check_loss_inputs
from ref_torch import losses as tl

CASES = {c.id: c for c in load_cases(only=["loss/*"])}


def _torch_value_and_grad(fn):
    def run(spec: LossSpec, prediction, target, weight=None, mask=None, dtype="float64") -> dict[str, Any]:
        check_loss_inputs(spec, prediction, target, weight, mask)
        x = torch.tensor(prediction, dtype=torch.float64, requires_grad=True)
        value, count = fn(spec, x, torch.tensor(target))
        value.sum().backward()
        v = value.detach().numpy()
        return {"value": v, "grad": x.grad.numpy(), "sum": float(v.sum() * count), "count": count}
    return run


@_torch_value_and_grad
def softmax_before_cross_entropy(spec, x, y):
    # the seeds' pitfall 1: probabilities passed where logits are expected
    return F.cross_entropy(F.softmax(x, -1), y, weight=None if spec.weight is None else torch.tensor(spec.weight),
                           label_smoothing=spec.label_smoothing, ignore_index=spec.ignore_index), float(len(y))


@_torch_value_and_grad
def ignore_index_counted_in_denominator(spec, x, y):
    # divides by every row instead of the non-ignored ones
    per = F.cross_entropy(x, y, ignore_index=spec.ignore_index, reduction="none",
                          label_smoothing=spec.label_smoothing)
    return per.sum() / len(y), float(len(y))


def mse_with_optax_half(spec: LossSpec, prediction, target, weight=None, mask=None, dtype="float64"):
    # optax.l2_loss is 0.5 * squared_error: porting MSELoss to it halves the loss
    check_loss_inputs(spec, prediction, target, weight, mask)
    with jax.enable_x64(True):
        f = lambda x: jnp.mean(optax.losses.l2_loss(x, jnp.asarray(target)))
        v, g = jax.value_and_grad(f)(jnp.asarray(prediction))
    return {"value": np.asarray(v), "grad": np.asarray(g), "sum": float(v) * target.size, "count": float(target.size)}


def _finish(spec: LossSpec, x: torch.Tensor, ell: torch.Tensor, count: torch.Tensor) -> dict[str, Any]:
    # torch's reductions over a per-element loss, then autograd
    value = ell if spec.reduction == "none" else ell.sum() if spec.reduction == "sum" else ell.sum() / count
    value.sum().backward()
    return {"value": value.detach().numpy(), "grad": x.grad.numpy(), "sum": float(ell.sum().detach()), "count": float(count.detach())}


def focal_without_modulating_factor(spec, prediction, target, weight=None, mask=None, sample_weight=None,
                                    dtype="float64"):
    # drops (1 − p_t)^γ: an alpha-weighted bce, not the focal loss
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    x, y = torch.tensor(prediction, requires_grad=True), torch.tensor(target)
    ell = F.binary_cross_entropy_with_logits(x, y, reduction="none")
    if spec.alpha >= 0:
        ell = (spec.alpha * y + (1 - spec.alpha) * (1 - y)) * ell
    return _finish(spec, x, ell, torch.tensor(float(ell.numel()), dtype=torch.float64))


def pos_weight_on_negatives(spec, prediction, target, weight=None, mask=None, sample_weight=None, dtype="float64"):
    # weighs the negative term instead of the positive one
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    x, y = torch.tensor(prediction, requires_grad=True), torch.tensor(target)
    pw = torch.tensor(spec.pos_weight if spec.pos_weight is not None else 1.0, dtype=torch.float64)
    ell = -(y * F.logsigmoid(x) + pw * (1 - y) * F.logsigmoid(-x))
    return _finish(spec, x, ell, torch.tensor(float(ell.numel()), dtype=torch.float64))


def mask_as_weights(spec, prediction, target, weight=None, mask=None, sample_weight=None, dtype="float64"):
    # multiplies by the mask instead of selecting with it: 0·inf and 0·NaN are NaN
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    x = torch.tensor(prediction, requires_grad=True)
    y = torch.tensor(target)
    w = None if spec.weight is None else torch.tensor(spec.weight, dtype=torch.float64)
    ell, c = tl.elementwise(spec, x, y, w)
    m = torch.ones_like(ell) if mask is None else torch.tensor(np.asarray(mask, np.float64))
    return _finish(spec, x, m * ell, (m * c).sum())


def sample_weight_normalized(spec, prediction, target, weight=None, mask=None, sample_weight=None, dtype="float64"):
    # sklearn's np.average convention: Σ s·ℓ / Σ s instead of Keras's Σ s·ℓ / count
    out = tl.loss_value_and_grad(spec.model_copy(update={"reduction": "sum"}), prediction, target, weight, mask,
                                 sample_weight)
    shape = out["grad"].shape if spec.name not in ("cross_entropy", "nll") else np.shape(target)
    s = np.ones(()) if sample_weight is None else np.asarray(sample_weight, np.float64)
    total_s = float(np.broadcast_to(s.reshape(s.shape + (1,) * (len(shape) - s.ndim)), shape).sum())
    return {**out, "value": np.asarray(out["sum"] / total_s), "grad": out["grad"] / total_s}


def optax_style_bce(spec, prediction, target, weight=None, mask=None, sample_weight=None, dtype="float64"):
    # optax.sigmoid_binary_cross_entropy's −y·log σ(x) − (1 − y)·log σ(−x): +inf at a −inf logit with
    # y > 0, where torch's formula gives NaN (L-NEGINF)
    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    with jax.enable_x64(True):
        pw = 1.0 if spec.pos_weight is None else jnp.asarray(spec.pos_weight)

        def f(x):
            y = jnp.asarray(target)
            return -(pw * y * jax.nn.log_sigmoid(x) + (1 - y) * jax.nn.log_sigmoid(-x))

        x = jnp.asarray(prediction)
        ell = f(x)
        grad = jax.grad(lambda a: f(a).sum())(x)
    v = np.asarray(ell)
    return {"value": v, "grad": np.asarray(grad), "sum": float(v.sum()), "count": float(v.size)}


MUTANTS = {
    "softmax-before-ce": (softmax_before_cross_entropy, ["loss/seed-cross-entropy", "loss/ce-plain"]),
    "ignore-index-denominator": (ignore_index_counted_in_denominator, ["loss/ce-ignore", "loss/ce-ignore-smooth"]),
    "mse-optax-half": (mse_with_optax_half, ["loss/seed-mse", "loss/mse-mean"]),
    "focal-without-modulating-factor": (focal_without_modulating_factor,
                                        ["loss/focal-default", "loss/focal-gamma-3", "loss/focal-none"]),
    "pos-weight-on-negatives": (pos_weight_on_negatives, ["loss/bce-pos-weight", "loss/bce-pos-weight-one-1d",
                                                          "loss/bce-pos-weight-column-3d"]),
    "mask-as-weights": (mask_as_weights, ["loss/bce-neg-inf-masked", "loss/ce-neg-inf-target-masked"]),
    "sample-weight-normalized": (sample_weight_normalized, ["loss/ce-sample-weight", "loss/mse-sample-weight-mean"]),
    "optax-style-bce": (optax_style_bce, ["loss/bce-neg-inf-none"]),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_harness_catches_planted_bug(mutant: str) -> None:
    fn, case_ids = MUTANTS[mutant]
    bad = PatchedBackend("torch", patches=(("losses", "loss_value_and_grad", fn),))
    for cid in case_ids:
        result = run_case(CASES[cid], bad)
        assert not result.passed, f"{mutant} passed {cid}: the check has no teeth"
        assert result.message
        # ...while the real backend passes the very same case
        assert run_case(CASES[cid], Backend("torch")).passed
