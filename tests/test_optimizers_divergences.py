"""Every default or semantic difference between torch.optim and optax that docs/divergences.md#optimizers
lists, pinned: each test measures the difference (or the exact recipe that removes it) with both
frameworks' own built-ins in float64, and fails if either framework changes its behaviour."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

STEPS = 6
RNG = np.random.default_rng(0)
P0 = RNG.standard_normal((3, 4))
GRADS = [RNG.standard_normal((3, 4)) for _ in range(STEPS)]


def torch_run(make, grads=GRADS, p0=P0, lrs=None) -> np.ndarray:
    p = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float64))
    opt = make([p])
    for k, g in enumerate(grads):
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[k]
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return p.detach().numpy().copy()


def optax_run(tx, grads=GRADS, p0=P0) -> np.ndarray:
    with jax.enable_x64(True):
        p = jnp.asarray(p0)
        s = tx.init(p)
        for g in grads:
            u, s = tx.update(jnp.asarray(g), s, p)
            p = optax.apply_updates(p, u)
        return np.asarray(p)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def defaults(fn) -> dict:
    return {k: v.default for k, v in inspect.signature(fn).parameters.items()}


def test_sgd_dampening_has_no_optax_equivalent() -> None:
    """torch's first momentum buffer is g, not (1 - d)·g: optax's closest chain differs."""
    want = torch_run(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.5))
    got = optax_run(optax.chain(optax.scale(0.5), optax.trace(0.9), optax.scale_by_learning_rate(0.1)))
    assert rel(got, want) > 1e-2
    same = optax_run(optax.chain(optax.trace(0.9), optax.scale_by_learning_rate(0.1)))
    assert rel(same, torch_run(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))) < 1e-12  # dampening 0: equal


def test_adam_weight_decay_is_l2_not_adamw() -> None:
    want = torch_run(lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1))
    assert rel(optax_run(optax.adamw(0.01, weight_decay=0.1)), want) > 1e-4
    assert rel(optax_run(optax.chain(optax.add_decayed_weights(0.1), optax.adam(0.01))), want) < 1e-12


def test_adamw_default_weight_decay() -> None:
    assert defaults(torch.optim.AdamW)["weight_decay"] == 1e-2 and defaults(optax.adamw)["weight_decay"] == 1e-4
    want = torch_run(lambda p: torch.optim.AdamW(p, lr=0.01))
    assert rel(optax_run(optax.adamw(0.01, weight_decay=1e-2)), want) < 1e-12


@pytest.mark.parametrize("bias_correction_nu", [True, False])
def test_amsgrad_variants_differ(bias_correction_nu: bool) -> None:
    want = torch_run(lambda p: torch.optim.Adam(p, lr=0.1, amsgrad=True), grads=[g * (k + 1) ** -2 for k, g in enumerate(GRADS)])
    got = optax_run(optax.amsgrad(0.1, bias_correction_nu=bias_correction_nu), grads=[g * (k + 1) ** -2 for k, g in enumerate(GRADS)])
    assert rel(got, want) > 1e-4


def test_rmsprop_defaults_and_eps_placement() -> None:
    assert defaults(torch.optim.RMSprop)["alpha"] == 0.99 and defaults(optax.rmsprop)["decay"] == 0.9
    assert defaults(optax.rmsprop)["eps_in_sqrt"] is True
    small = [g * 1e-4 for g in GRADS]
    want = torch_run(lambda p: torch.optim.RMSprop(p, lr=0.01), grads=small)
    assert rel(optax_run(optax.rmsprop(0.01, decay=0.99), grads=small), want) > 1e-6
    assert rel(optax_run(optax.rmsprop(0.01, decay=0.99, eps_in_sqrt=False), grads=small), want) < 1e-12


def test_rmsprop_momentum_applies_the_lr_before_the_buffer_in_optax() -> None:
    """optax.rmsprop's trace accumulates lr_t·g/s; torch multiplies the buffer by the current lr."""
    lrs = [0.1 * 0.5 ** k for k in range(STEPS)]
    want = torch_run(lambda p: torch.optim.RMSprop(p, lr=0.1, momentum=0.9), lrs=lrs)
    sched = lambda c: 0.1 * 0.5 ** jnp.asarray(c, jnp.float64)  # noqa: E731
    alias = optax_run(optax.rmsprop(sched, decay=0.99, eps_in_sqrt=False, momentum=0.9))
    recipe = optax_run(optax.chain(optax.scale_by_rms(0.99, 1e-8, eps_in_sqrt=False), optax.trace(0.9),
                                   optax.scale_by_learning_rate(sched)))
    assert rel(alias, want) > 1e-2 and rel(recipe, want) < 1e-12


def test_adagrad_defaults_and_eps_placement() -> None:
    assert defaults(torch.optim.Adagrad)["initial_accumulator_value"] == 0 and defaults(torch.optim.Adagrad)["eps"] == 1e-10
    assert defaults(optax.adagrad)["initial_accumulator_value"] == 0.1 and defaults(optax.adagrad)["eps"] == 1e-7
    want = torch_run(lambda p: torch.optim.Adagrad(p, lr=0.1))
    assert rel(optax_run(optax.adagrad(0.1)), want) > 1e-3
    assert rel(optax_run(optax.adagrad(0.1, initial_accumulator_value=0.0, eps=0.0)), want) > 1e-13  # eps placement


def test_nadam_momentum_schedule() -> None:
    want = torch_run(lambda p: torch.optim.NAdam(p, lr=0.01))
    assert rel(optax_run(optax.nadam(0.01)), want) > 1e-4
    no_schedule = torch_run(lambda p: torch.optim.NAdam(p, lr=0.01, momentum_decay=1e9))
    assert rel(optax_run(optax.nadam(0.01)), no_schedule) > 1e-10  # torch's float32 mu_product
    torch.set_default_dtype(torch.float64)  # torch's own float64 mode: a float64 mu_product
    try:
        exact = torch_run(lambda p: torch.optim.NAdam(p, lr=0.01, momentum_decay=1e9))
    finally:
        torch.set_default_dtype(torch.float32)
    assert rel(optax_run(optax.nadam(0.01)), exact) < 1e-12


def test_radam_eps_and_threshold() -> None:
    small = [g * 1e-7 for g in GRADS * 2]
    want = torch_run(lambda p: torch.optim.RAdam(p, lr=0.01), grads=small)
    assert rel(optax_run(optax.radam(0.01), grads=small), want) > 1e-9


def test_adamax_is_the_same() -> None:
    assert rel(optax_run(optax.adamax(0.01)), torch_run(lambda p: torch.optim.Adamax(p, lr=0.01))) < 1e-12


def test_lion_default_weight_decay_and_twinstep_lion() -> None:
    from ref_torch._elementwise import Lion

    assert defaults(optax.lion)["weight_decay"] == 1e-3 and defaults(Lion)["weight_decay"] == 0.0
    want = torch_run(lambda p: Lion(p, lr=0.01))
    assert rel(optax_run(optax.lion(0.01)), want) > 1e-5
    assert rel(optax_run(optax.lion(0.01, weight_decay=0.0)), want) < 1e-12


def test_adafactor_differs_and_factors_other_axes() -> None:
    d = defaults(optax.adafactor)
    assert d["learning_rate"] is None and d["min_dim_size_to_factor"] == 128 and d["multiply_by_parameter_scale"] is True
    want = torch_run(lambda p: torch.optim.Adafactor(p, lr=0.01))
    assert rel(optax_run(optax.adafactor(0.01)), want) > 1e-3
    from optax._src import factorized

    def recipe(lr: float) -> optax.GradientTransformation:
        return optax.chain(
            factorized.scale_by_factored_rms(True, 0.8, 0, 1, 1e-30,
                                             decay_rate_fn=lambda i, r: 1.0 - (jnp.asarray(i, jnp.float64) + 1.0) ** (-r)),
            optax.clip_by_block_rms(1.0),
            optax.scale_by_learning_rate(lambda c: jnp.minimum(lr, 1.0 / jnp.sqrt(c + 1.0)), flip_sign=False),
            optax.scale_by_param_block_rms(1e-3), optax.scale(-1.0))

    grads2 = [g * 1e3 for g in GRADS]
    assert rel(optax_run(recipe(0.01), grads=grads2), torch_run(lambda p: torch.optim.Adafactor(p, lr=0.01, eps=(1e-30, 1e-3)), grads=grads2)) < 1e-9
    p3 = RNG.standard_normal((8, 4, 3))
    g3 = [RNG.standard_normal((8, 4, 3)) for _ in range(3)]
    t3 = torch_run(lambda p: torch.optim.Adafactor(p, lr=0.01, eps=(1e-30, 1e-3)), grads=g3, p0=p3)
    assert rel(optax_run(recipe(0.01), grads=g3, p0=p3), t3) > 1e-4  # optax factors (8, 4), torch (4, 3)


def test_muon_in_optax_contrib_is_another_algorithm() -> None:
    p0, grads = RNG.standard_normal((4, 3)), [RNG.standard_normal((4, 3)) for _ in range(4)]
    want = torch_run(lambda p: torch.optim.Muon(p, lr=0.02, weight_decay=0.0), grads=grads, p0=p0)
    got = optax_run(optax.contrib.muon(0.02), grads=grads, p0=p0)
    assert rel(got, want) > 1e-3  # bias-corrected momentum, eps added to the norm, no bfloat16


def test_torch_muon_runs_newton_schulz_in_bfloat16() -> None:
    from torch.optim._muon import _zeropower_via_newtonschulz

    from ref_torch._muon import newton_schulz

    g = torch.tensor(RNG.standard_normal((6, 5)))
    coeffs = (3.4445, -4.7750, 2.0315)
    low = _zeropower_via_newtonschulz(g, coeffs, 5, 1e-7)
    assert low.dtype == torch.bfloat16
    assert rel(low.double().numpy(), newton_schulz(g, coeffs, 5, 1e-7, torch.float64).numpy()) > 1e-4


def test_torch_adagrad_ignores_a_groups_initial_accumulator_value() -> None:
    a, b = (torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)) for _ in range(2))
    opt = torch.optim.Adagrad([{"params": [a]}, {"params": [b], "initial_accumulator_value": 0.5}], lr=0.1)
    assert torch.equal(opt.state[b]["sum"], torch.zeros(2, dtype=torch.float64))  # twinstep uses 0.5


def test_torch_adafactor_fails_on_zero_size_parameters() -> None:
    p = torch.nn.Parameter(torch.zeros(0, dtype=torch.float64))
    opt = torch.optim.Adafactor([p])
    p.grad = torch.zeros(0, dtype=torch.float64)
    with pytest.raises(ZeroDivisionError):
        opt.step()


def test_torch_nadam_mu_product_follows_the_default_dtype() -> None:
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = torch.optim.NAdam([p])
    p.grad = torch.ones(2, dtype=torch.float64)
    opt.step()
    assert torch.get_default_dtype() == torch.float32 and opt.state[p]["mu_product"].dtype == torch.float32


def test_optax_counts_are_int32_torch_steps_float() -> None:
    with jax.enable_x64(True):
        assert optax.scale_by_adam().init(jnp.zeros(2)).count.dtype == jnp.int32
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p])
    p.grad = torch.ones(2)
    opt.step()
    assert opt.state[p]["step"].dtype == torch.float32 and float(torch.tensor(2.0**24, dtype=torch.float32) + 1) == 2.0**24
