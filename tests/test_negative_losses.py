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


MUTANTS = {
    "softmax-before-ce": (softmax_before_cross_entropy, ["loss/seed-cross-entropy", "loss/ce-plain"]),
    "ignore-index-denominator": (ignore_index_counted_in_denominator, ["loss/ce-ignore", "loss/ce-ignore-smooth"]),
    "mse-optax-half": (mse_with_optax_half, ["loss/seed-mse", "loss/mse-mean"]),
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
