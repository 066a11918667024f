"""Pinned differences between torch.optim.lr_scheduler and optax schedules (docs/divergences.md#schedules).

Each test asserts what the frameworks do today, so it fails if either one changes; the twinstep
recipe for each is checked by the conformance cases named in the doc.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from torch.optim import lr_scheduler as S


def torch_lrs(make, steps: int, lr: float = 0.1) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lr)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_s_past_t_max_torch_climbs_optax_clamps() -> None:
    lrs = torch_lrs(lambda o: S.CosineAnnealingLR(o, 10), 21)
    assert lrs[10] == pytest.approx(0.0, abs=1e-17) and lrs[20] == pytest.approx(0.1, rel=1e-12)
    with jax.enable_x64(True):
        assert float(optax.cosine_decay_schedule(0.1, 10)(20.0)) == 0.0


def test_s_int32_count_makes_optax_schedules_float32() -> None:
    with jax.enable_x64(True):
        count = jnp.int32(7)
        assert optax.exponential_decay(0.1, 3, 0.5, staircase=False)(count).dtype == jnp.float32
        assert optax.linear_schedule(0.1, 0.01, 9)(count).dtype == jnp.float32
        assert optax.cosine_decay_schedule(0.1, 9)(count).dtype == jnp.float64
        exact = optax.exponential_decay(0.1, 3, 0.5)(jnp.float64(7))
        assert exact.dtype == jnp.float64
        assert abs(float(optax.exponential_decay(0.1, 3, 0.5)(count)) - float(exact)) > 1e-12


def test_s_onecycle_optax_phases_end_one_update_later() -> None:
    lrs = torch_lrs(lambda o: S.OneCycleLR(o, 0.1, 100), 100)
    with jax.enable_x64(True):
        sched = optax.cosine_onecycle_schedule(100, 0.1)
        ox = [float(sched(jnp.float64(t))) for t in range(100)]
    assert int(np.argmax(lrs)) == 29 and int(np.argmax(ox)) == 30
    assert lrs[-1] == pytest.approx(0.1 / 25 / 1e4, rel=1e-9) and ox[-1] > 1e-5


def test_s_onecycle_raises_past_total_steps_and_sets_initial_lr() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5, momentum=0.9)
    sched = S.OneCycleLR(opt, 0.1, 5)
    assert opt.param_groups[0]["initial_lr"] == pytest.approx(0.1 / 25)  # overwritten, not the lr 0.5
    for _ in range(5):
        opt.step()
        sched.step()
    opt.step()
    with pytest.raises(ValueError, match="Tried to step 6 times"):
        sched.step()


def test_s_linear_lr_cannot_start_at_zero_optax_can() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        S.LinearLR(torch.optim.SGD([p], lr=0.1), start_factor=0.0)
    assert float(optax.linear_schedule(0.0, 0.1, 5)(0)) == 0.0


def test_s_linear_lr_recursion_overflows_for_tiny_start_factor() -> None:
    lrs = torch_lrs(lambda o: S.LinearLR(o, start_factor=5e-324, total_iters=3), 3)
    assert not math.isfinite(lrs[1])
    assert math.isclose(torch_lrs(lambda o: S.LinearLR(o, start_factor=1e-100, total_iters=3), 4)[3], 0.1)


def test_s_restarts_torch_forever_optax_sgdr_stops() -> None:
    lrs = torch_lrs(lambda o: S.CosineAnnealingWarmRestarts(o, 4), 13)
    assert lrs[8] == lrs[12] == 0.1
    with jax.enable_x64(True):
        cycle = dict(init_value=0.1, peak_value=0.1, warmup_steps=0, decay_steps=4, end_value=0.0)
        sgdr = optax.sgdr_schedule([cycle, cycle])
        # the second cycle restarts at 4; after it (t >= 8) optax stays at end_value, torch restarts again
        assert float(sgdr(jnp.float64(4))) == pytest.approx(0.1)
        assert float(sgdr(jnp.float64(8))) == float(sgdr(jnp.float64(12))) == 0.0


def test_s_warmup_cosine_decay_steps_include_the_warmup() -> None:
    w, total = 5, 20
    seq = lambda t_max: lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, w), S.CosineAnnealingLR(o, t_max)], [w])  # noqa: E731
    with jax.enable_x64(True):
        ox = np.asarray(optax.warmup_cosine_decay_schedule(0.01, 0.1, w, total)(jnp.arange(total + 1.0)))
    np.testing.assert_allclose(torch_lrs(seq(total - w), total + 1), ox, rtol=1e-12, atol=1e-16)
    assert np.abs(np.array(torch_lrs(seq(total), total + 1)) - ox).max() > 1e-2


def test_s_eta_min_absolute_in_torch_relative_alpha_in_optax() -> None:
    assert torch_lrs(lambda o: S.CosineAnnealingLR(o, 4, eta_min=1e-3), 5, lr=0.5)[4] == pytest.approx(1e-3)
    with jax.enable_x64(True):
        assert float(optax.cosine_decay_schedule(0.5, 4, alpha=1e-3)(4.0)) == pytest.approx(5e-4)


def test_s_exponential_decay_rate_zero_is_constant_in_optax() -> None:
    assert torch_lrs(lambda o: S.StepLR(o, 1, gamma=0.0), 3) == [0.1, 0.0, 0.0]
    assert float(optax.exponential_decay(0.1, 1, 0.0)(2)) == 0.1


def test_s_nested_sequential_fails_in_torch() -> None:
    def nested(o):
        inner = S.SequentialLR(o, [S.ConstantLR(o, 0.5, 2), S.ExponentialLR(o, 0.9)], [2])
        return S.SequentialLR(o, [S.LinearLR(o, 0.5, 1.0, 2), inner], [3])

    with pytest.raises(NotImplementedError):
        torch_lrs(nested, 6)


def test_s_sequential_restart_equals_optax_join_schedules() -> None:
    lrs = torch_lrs(lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.2, 1.0, 6), S.ExponentialLR(o, 0.9)], [3]), 8)
    with jax.enable_x64(True):
        joined = optax.join_schedules([optax.linear_schedule(0.02, 0.1, 6), optax.exponential_decay(0.1, 1, 0.9)], [3])
        ox = [float(joined(jnp.float64(t))) for t in range(8)]
    np.testing.assert_allclose(lrs, ox, rtol=1e-14)
    assert lrs[2] == pytest.approx(0.1 * (0.2 + 0.8 * 2 / 6)) and lrs[3] == pytest.approx(0.1)  # cut mid-ramp, restarted at the base lr
