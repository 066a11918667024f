"""The torch update's finite check without loss scaling (ref_torch/_update.py): the flag comes with the
pre-clip p-norm (a NaN or inf gradient makes every p-norm NaN or inf), and a norm that is inf on
finite gradients (float32 overflow of the sum of powers) is checked element by element, so such an
update is applied, not skipped. Parametrized over norm types, and over SGD's kernels: with the fused
one the step is held on the device until the host has read the norm (ref_torch._update's held
path), then applied; negative control: taking the flag from the norm alone skips the overflowing
but finite update, and the check catches it."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.config.accumulation import AccumulationSpec
from conformance.config.clip import ClipSpec
from conformance.config.precision import PrecisionSpec
from ref_torch import _update as tupd
from ref_torch import precision as tp
from ref_torch.losses import LossOutput


class Planted(torch.autograd.Function):
    """A loss of 0 (finite) whose gradient is `value` in every element: the finite check must come
    from the gradients, not from the loss."""

    @staticmethod
    def forward(ctx: object, w: torch.Tensor, value: float) -> torch.Tensor:
        ctx.value, ctx.shape = value, w.shape  # type: ignore[attr-defined]
        return w.sum() * 0.0

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.full(ctx.shape, ctx.value, dtype=grad.dtype), None  # type: ignore[attr-defined]


def one_update(grad_value: float, norm_type: float, fused: bool = False) -> tuple[bool, float, torch.Tensor]:
    """(skipped, logged grad_norm, the parameter after) of one float32 update through the trainer's
    path whose loss is 0 and whose gradient is grad_value in both elements (plain SGD)."""
    w = torch.nn.Parameter(torch.tensor([1.0, -1.0], dtype=torch.float32))
    params = {"w": w}
    opt = torch.optim.SGD([w], lr=0.1, fused=fused)
    assert tupd._holds_on_device(opt) == fused

    def loss_fn(p: dict, mb: dict) -> LossOutput:
        total = Planted.apply(p["w"], grad_value)
        return LossOutput(total, total, torch.tensor(1.0))

    precision = PrecisionSpec(loss_scale="none")
    specs = tupd.UpdateSpecs(AccumulationSpec(steps=1), ClipSpec(max_norm=1.0, norm_type=norm_type), precision)
    scaler = tp.LossScaler(precision)
    assert not scaler.enabled
    _, info = tupd.apply_update(specs, params, opt, None, scaler, tp.init_skip_state(), loss_fn, [{}], update=0)
    return info.skipped, info.grad_norm, w.detach().clone()


def applied_despite_overflowing_norm(norm_type: float, fused: bool = False) -> bool:
    """The check: finite gradients whose float32 p-norm overflows are applied (not skipped)."""
    skipped, norm, after = one_update(3e38, norm_type, fused)
    return not skipped and math.isinf(norm) and bool(torch.isfinite(after).all())


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.0])
def test_finite_gradients_with_an_overflowing_norm_are_applied(norm_type: float, fused: bool) -> None:
    assert applied_despite_overflowing_norm(norm_type, fused)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("norm_type", [1.0, 2.0, math.inf])
def test_a_nonfinite_gradient_is_skipped(bad: float, norm_type: float, fused: bool) -> None:
    skipped, _, after = one_update(bad, norm_type, fused)
    assert skipped and torch.equal(after, torch.tensor([1.0, -1.0]))


@pytest.mark.parametrize("fused", [False, True])
def test_a_finite_update_is_applied_with_its_norm(fused: bool) -> None:
    skipped, norm, after = one_update(3.0, 2.0, fused)
    assert not skipped and norm == pytest.approx(math.sqrt(18.0)) and not torch.equal(after, torch.tensor([1.0, -1.0]))


@pytest.mark.parametrize("fused", [False, True])
def test_negative_control_the_norm_alone_is_not_enough(monkeypatch: pytest.MonkeyPatch, fused: bool) -> None:
    monkeypatch.setattr(tupd, "grads_finite", lambda grads: torch.tensor(False))  # "non-finite norm = skip"
    assert not applied_despite_overflowing_norm(2.0, fused)
