"""Pinned differences for the peers' schedules (docs/divergences.md#schedules: S-CHAINED,
S-CHAINED-TMAX, S-CYCLIC, S-PLATEAU, S-PLATEAU-NEG, S-ENDVALUE, S-STAIRCASE, S-POLY-JIT, S-SEQ-CHAINED, K-RESTARTS-F32).

Each test asserts what torch, optax or Keras do today, so it fails if one of them changes; the
twinstep recipe for each is checked by the conformance cases named in the doc.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from support.processes import PROCESS_S, run_process
import torch
from torch.optim import lr_scheduler as S

ROOT = Path(__file__).resolve().parent.parent


def torch_lrs(make, steps: int, lr: float = 0.1, metrics: list[float] | None = None, momentum: float = 0.0):
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lr, momentum=momentum)
    sched = make(opt)
    out = []
    for t in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step(metrics[t]) if metrics is not None else sched.step()
    return out


def test_s_chained_multiplies_where_optax_joins() -> None:
    # torch's ChainedScheduler is the product of its parts; optax has no chain: a product of schedules
    # matches it, join_schedules / warmup_cosine_decay_schedule do not (reference/semantics.md §3)
    lrs = torch_lrs(lambda o: S.ChainedScheduler([S.LinearLR(o, 0.01, 1.0, 10), S.CosineAnnealingLR(o, 100)]), 100)
    with jax.enable_x64(True):
        t = jnp.arange(100, dtype=jnp.float64)
        product = optax.linear_schedule(0.01, 1.0, 10)(t) * optax.cosine_decay_schedule(0.1, 100)(t)
        warm = optax.warmup_cosine_decay_schedule(0.001, 0.1, 10, 100)(t)
    assert np.max(np.abs(np.asarray(product) - lrs)) < 1e-15
    assert np.max(np.abs(np.asarray(warm) - lrs)) > 5e-3


def test_s_chained_cosine_past_t_max_is_not_a_factor() -> None:
    # past T_max, CosineAnnealingLR adds (base_lr − eta_min)·(1 − cos(π/T))/2 to the lr: the other
    # factors are lost (here ExponentialLR's 0.9^t), so chained parts may not pass t_max
    lrs = torch_lrs(lambda o: S.ChainedScheduler([S.ExponentialLR(o, 0.9), S.CosineAnnealingLR(o, 4)]), 8)
    product = [0.1 * 0.9 ** t * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(8)]
    np.testing.assert_allclose(lrs[:5], product[:5], rtol=1e-12, atol=1e-18)
    assert abs(lrs[5] - product[5]) > 1e-3


def test_s_cyclic_overrides_the_lr_and_momentum_and_ignores_scale_mode() -> None:
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=0.5, momentum=0.0)
    sched = S.CyclicLR(opt, 0.01, 0.1, 4, mode="triangular2", scale_mode="iterations")
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["momentum"] == 0.9  # base_lr, max_momentum
    assert sched.scale_mode == "cycle"  # the built-in modes force their scale_mode
    with pytest.raises(ValueError, match="optimizer must support momentum"):
        S.CyclicLR(torch.optim.Adagrad([p]), 0.01, 0.1)
    assert not hasattr(optax, "cyclic_schedule") and not hasattr(optax, "triangular_schedule")


def _optax_plateau(values: list[float], **kw) -> list[float]:
    tx = optax.contrib.reduce_on_plateau(**kw)
    update = jax.jit(lambda state, v: tx.update(jnp.zeros(1), state, value=v)[1])
    state = tx.init(jnp.zeros(1))
    scales = []
    for v in values:
        scales.append(float(state.scale))
        state = update(state, jnp.float32(v))
    return scales


def test_s_plateau_optax_reduces_one_observation_earlier() -> None:
    # torch reduces after patience + 1 bad observations, optax.contrib.reduce_on_plateau after patience
    flat = [1.0] * 8
    lrs = torch_lrs(lambda o: S.ReduceLROnPlateau(o, patience=2, factor=0.5), 8, lr=1.0, metrics=flat)
    scales = _optax_plateau(flat, patience=2, factor=0.5)
    assert lrs.index(0.5) == 4 and scales.index(0.5) == 3
    assert _optax_plateau(flat, patience=3, factor=0.5) == lrs  # optax's patience p + 1 is torch's p


def test_s_plateau_negative_metric_never_reduces_in_torch_or_optax() -> None:
    # mode min, rel: better when m < best·(1 − threshold); for best < 0 that bound lies above best, so
    # a constant negative metric "improves" every time (optax PR #1767, open, would use |best|)
    neg = [-1.0] * 20
    assert set(torch_lrs(lambda o: S.ReduceLROnPlateau(o, patience=2), 20, metrics=neg)) == {0.1}
    assert set(_optax_plateau(neg, patience=2)) == {1.0}
    pos = [1.0] * 20
    assert min(torch_lrs(lambda o: S.ReduceLROnPlateau(o, patience=2), 20, metrics=pos)) < 0.1


def test_s_end_values_only_in_optax() -> None:
    # optax's polynomial_schedule / exponential_decay take an end value and linear_schedule any start;
    # torch's PolynomialLR decays to 0, ExponentialLR has no floor, LinearLR refuses start_factor > 1
    with jax.enable_x64(True):
        assert float(optax.polynomial_schedule(0.1, 0.02, 2.0, 10)(20.0)) == pytest.approx(0.02)
        assert float(optax.exponential_decay(0.1, 1, 0.5, end_value=0.03)(10.0)) == pytest.approx(0.03)
        assert float(optax.linear_schedule(0.5, 0.1, 4)(0.0)) == 0.5
    assert torch_lrs(lambda o: S.PolynomialLR(o, 10, 2.0), 12)[-1] == 0.0
    assert torch_lrs(lambda o: S.ExponentialLR(o, 0.5), 12)[-1] < 0.03 * 0.1
    with pytest.raises(ValueError, match="Starting multiplicative factor"):
        S.LinearLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), start_factor=5.0)


def test_s_staircase_lands_early_under_a_float64_count() -> None:
    # optax.exponential_decay(staircase=True) floors count / k; on a float64 array XLA multiplies by
    # 1/k, which falls just short of m at some boundaries count = m·k (k = 49: 211 of 20000 updates)
    want = 0.5 ** (np.arange(20_000) // 49)
    with jax.enable_x64(True):
        got = np.asarray(optax.exponential_decay(1.0, 49, 0.5, staircase=True)(jnp.arange(20_000, dtype=jnp.float64)))
        exact = np.asarray(0.5 ** (jnp.arange(20_000, dtype=jnp.float64) // 49))
    wrong = np.flatnonzero(got != want)
    assert wrong.size > 100 and np.all(wrong % 49 == 0)  # only boundaries, one step early
    np.testing.assert_array_equal(exact, want)  # floor division is exact (twinstep's step)


def test_s_seq_chained_torch_steps_a_chained_first_part_once_more() -> None:
    # SequentialLR's construction steps a first-part ChainedScheduler's parts outside their initial
    # step: ExponentialLR, PolynomialLR and CosineAnnealingLR then run a step ahead; ConstantLR,
    # StepLR, MultiStepLR and LinearLR (which check last_epoch == 0) do not
    def first(parts):
        return lambda o: S.SequentialLR(o, [S.ChainedScheduler(parts(o)), S.ConstantLR(o, 0.5, 3)], [6])

    def alone(parts):
        return lambda o: S.ChainedScheduler(parts(o))

    ahead = lambda o: [S.StepLR(o, 2, 0.5), S.ExponentialLR(o, 0.9)]  # noqa: E731
    assert torch_lrs(alone(ahead), 3) == pytest.approx([0.1, 0.09, 0.0405], rel=1e-15)
    assert torch_lrs(first(ahead), 3) == pytest.approx([0.09, 0.081, 0.03645], rel=1e-15)  # γ^(t+1)
    for late in (lambda o: S.PolynomialLR(o, 10, 1.0), lambda o: S.CosineAnnealingLR(o, 10)):
        assert torch_lrs(first(lambda o: [late(o)]), 3) != torch_lrs(alone(lambda o: [late(o)]), 3)
    exact = lambda o: [S.LinearLR(o, 0.2, 1.0, 3), S.StepLR(o, 2, 0.5), S.ConstantLR(o, 0.5, 2),  # noqa: E731
                       S.MultiStepLR(o, [1, 3], 0.5)]
    assert torch_lrs(first(exact), 6) == torch_lrs(alone(exact), 6)
    with pytest.raises(NotImplementedError):  # a later chained part: refused at its milestone
        torch_lrs(lambda o: S.SequentialLR(o, [S.ConstantLR(o, 0.5, 3), S.ChainedScheduler([S.StepLR(o, 2, 0.5)])],
                                           [2]), 4)


def test_s_poly_jit_optax_polynomial_is_nan_jitted_past_its_end() -> None:
    # jitted, 1 − count/T becomes a fused multiply-add of count·(1/T): slightly negative at count = T
    for steps in (6, 10):
        poly, linear = optax.polynomial_schedule(0.1, 0.0, 0.9, steps), optax.linear_schedule(0.1, 0.0, steps)
        at = [jnp.int32(steps), jnp.int32(steps + 1)]
        assert all(math.isnan(float(jax.jit(poly)(t))) for t in at)
        assert all(float(poly(t)) == 0.0 for t in at)  # eagerly: 0, as torch's PolynomialLR
        assert all(-1e-8 < float(jax.jit(linear)(t)) < 0.0 for t in at)  # a negative lr
    with jax.enable_x64(True):
        assert math.isnan(float(jax.jit(optax.polynomial_schedule(0.1, 0.0, 0.9, 10))(jnp.float64(10))))
    assert torch_lrs(lambda o: S.PolynomialLR(o, 10, 0.9), 12)[10:] == [0.0, 0.0]


def test_k_restarts_keras_takes_its_cosine_in_float32() -> None:
    """Keras 3's CosineDecayRestarts with a float64 initial lr, on JAX with x64: its ops.cos promotes
    float64 with a Python float to float32, so it meets its own test's float64 reference only to
    ~1e-8 (its test's tolerance is 1e-6); twinstep's cases keep the reference's values."""
    code = ("import json, sys; sys.path.insert(0, 'tools'); from _schedule_refs import keras_schedule, keras_restarts;"
            "steps = list(range(0, 1500, 250));"
            "print(json.dumps([keras_schedule(1.0, 1000, 2.0, 0.9, 0.0, steps),"
            " [keras_restarts(s, 1000, 2.0, 0.9) for s in steps]]))")
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(ROOT)}
    out = run_process([sys.executable, "-c", code], "print Keras's schedule", PROCESS_S, cwd=ROOT, env=env,
                      capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    keras, reference = (np.array(x) for x in json.loads(out.stdout.strip().splitlines()[-1]))
    err = np.max(np.abs(keras - reference))
    assert 1e-9 < err < 1e-6
