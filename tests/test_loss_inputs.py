"""What a loss accepts and refuses, on every backend: one-line input errors, case files whose expected
values cannot mean what they say (CaseError), and a +inf loss from a -inf logit in training."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.config.loss import LossSpec
from conformance.errors import CaseError, InputError
from conformance.harness.backends import Backend
from conformance.harness.case import load_case


def evaluate(backend: str, spec: LossSpec, **arrays) -> dict:
    b = Backend(backend)
    with b.context():
        return b.function("losses", "loss_value_and_grad")(spec, **arrays)


@pytest.mark.parametrize("backend_name", ["torch", "jax", "oracle"])
@pytest.mark.parametrize(("spec", "inputs", "message"), [
    (LossSpec(name="mse"), {"mask": np.array([1.0, 0.5, 0.0])}, r"mask must hold only 0 or 1 \(or booleans\); found 0.5 at index \(1\)"),
    (LossSpec(name="mse"), {"mask": np.array([1.0, np.nan, 0.0])}, r"mask must hold only 0 or 1 .*found nan"),
    (LossSpec(name="mse"), {"prediction": np.array([1.0, -np.inf, 0.0])}, r"-inf logits \(probability 0\) are accepted by"),
    (LossSpec(name="sigmoid_focal"), {"prediction": np.array([1.0, np.inf, 0.0])}, r"non-finite value \(inf\) at index \(1\)"),
    (LossSpec(name="mse"), {"sample_weight": np.array([[1.0]])}, r"sample_weight shape \(1, 1\) must be the leading"),
])
def test_input_errors(backend_name: str, spec: LossSpec, inputs: dict, message: str) -> None:
    arrays = {"prediction": np.array([1.0, 2.0, 3.0]), "target": np.array([0.0, 1.0, 1.0]), **inputs}
    with pytest.raises(InputError, match=message):
        evaluate(backend_name, spec, **arrays)


CASE = """id = "loss/x"
kind = "loss"
source = "test"
[loss]
name = "mse"
reduction = "{reduction}"
[inputs]
prediction = [[1.0, 2.0], [3.0, 4.0]]
target = [[1.0, 1.0], [1.0, 1.0]]
{inputs}
[expected]
{expected}
"""


@pytest.mark.parametrize(("reduction", "inputs", "expected", "message"), [
    ("none", "", "value = 1.0", r"expected.value must hold one loss per element, shape \(2, 2\)"),
    ("mean", "", "value = [1.0, 2.0]", r"expected.value must be one number for reduction = 'mean'"),
    ("sum", "", "value = 1.0\ngrad = [1.0, 2.0]", r"expected.grad must have the prediction's shape \(2, 2\)"),
    ("mean", "sample_weight = [1.0, 2.0, 3.0]", "value = 1.0", r"inputs.sample_weight shape \(3,\) must be the leading"),
    ("mean", "sample_weights = [1.0, 2.0]", "value = 1.0", r"inputs.sample_weights is not a known key"),
])
def test_case_format_misuse_is_a_case_error(tmp_path, reduction: str, inputs: str, expected: str, message: str) -> None:
    path = tmp_path / "x.toml"
    path.write_text(CASE.format(reduction=reduction, inputs=inputs, expected=expected))
    with pytest.raises(CaseError, match=message):
        load_case(path)


def test_neg_inf_target_logit_in_training_is_a_skipped_update() -> None:
    """A model that bans a class with -inf (the masking idiom) and meets it as a target: the loss is
    +inf, the gradients finite, and the update path skips the update (P-LOSS) on both twins."""
    import jax
    import optax
    import torch

    from conformance.config.accumulation import AccumulationSpec
    from conformance.config.clip import ClipSpec
    from conformance.config.precision import PrecisionSpec
    from ref_jax import _update as jupd
    from ref_jax import losses as jl
    from ref_jax import precision as jp
    from ref_jax._window import stack_window
    from ref_torch import _update as tupd
    from ref_torch import losses as tl
    from ref_torch import precision as tp

    rng = np.random.default_rng(0)
    w0, x, y = rng.normal(size=(3, 4)), rng.normal(size=(5, 3)), np.array([1, 0, 3, 2, 1])
    ban = np.zeros((5, 4), bool)
    ban[0, 1] = True  # row 0's own target class
    precision = PrecisionSpec(dtype="float64")
    spec = LossSpec(name="cross_entropy")

    def tloss(p, mb):
        return tl.compute_loss(spec, (mb["x"] @ p["w"]).masked_fill(mb["ban"], -np.inf), mb["y"])

    params = {"w": torch.nn.Parameter(torch.tensor(w0))}
    specs = tupd.UpdateSpecs(AccumulationSpec(steps=1), ClipSpec(), precision)
    _, info = tupd.apply_update(specs, params, torch.optim.SGD(params.values(), lr=0.1), None, tp.LossScaler(precision),
                                tp.init_skip_state(), tloss,
                                [{"x": torch.tensor(x), "y": torch.tensor(y), "ban": torch.tensor(ban)}])
    assert info.skipped and np.isfinite(info.grad_norm)
    assert np.array_equal(params["w"].detach().numpy(), w0)

    def jloss(p, mb):
        return jl.compute_loss(spec, jax.numpy.where(mb["ban"], -jax.numpy.inf, mb["x"] @ p["w"]), mb["y"])

    with jax.enable_x64(True):
        specs = jupd.UpdateSpecs(AccumulationSpec(steps=1), ClipSpec(), precision)
        tx = optax.sgd(0.1)
        jparams = {"w": jax.numpy.asarray(w0)}
        state = jupd.UpdateState(jparams, tx.init(jparams), jp.init_scale_state(precision), jp.init_skip_state())
        new, info = jupd.make_update_step(specs, tx, jloss)(state, stack_window([{"x": x, "y": y, "ban": ban}], None, 1,
                                                                                np.float64))
        metrics = jupd.finish_update(specs, new, info)
    assert metrics.skipped and np.isfinite(metrics.grad_norm)
    np.testing.assert_array_equal(np.asarray(new.params["w"]), w0)


def test_a_backend_without_sample_weight_is_unsupported_not_crashed() -> None:
    from conformance.harness.backends import PatchedBackend
    from conformance.harness.case import load_cases
    from conformance.harness.runner import run_case
    from ref_torch import losses as tl

    def old(spec, prediction, target, weight=None, mask=None, dtype="float64"):
        return tl.loss_value_and_grad(spec, prediction, target, weight, mask, dtype=dtype)

    bad = PatchedBackend("torch", patches=(("losses", "loss_value_and_grad", old),))
    cases = {c.id: c for c in load_cases(only=["loss/ce-sample-weight", "loss/ce-plain"])}
    result = run_case(cases["loss/ce-sample-weight"], bad)
    assert result.status == "unsupported" and "takes no sample_weight" in result.message
    assert run_case(cases["loss/ce-plain"], bad).passed
