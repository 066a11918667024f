"""AdEMAMix (`ademamix`, apple/ml-ademamix's torch class): the spec's fields and refusals, the
warm-ups of α and β3 on both twins against the oracle's and against hand values, and the bundled
cases from optax.contrib (tests/test_cases.py runs them on every backend; the negative controls are
in tests/test_negative_optimizer_semantics.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conformance.config import load_config
from conformance.errors import ConfigError
from conformance.harness.case import load_cases
from conformance.oracle import optimizers as oracle

HP = {"betas": (0.9, 0.999), "beta3": 0.9999, "alpha": 8.0, "alpha_warmup": 4, "beta3_warmup": 6}


def test_the_bundled_suite_has_ademamix_cases_with_both_warm_ups() -> None:
    cases = [c for c in load_cases(only=["optimizer/*ademamix*"])]
    specs = [c.sections["optimizer"] for c in cases]
    assert len(cases) >= 4 and all(s.name == "ademamix" for s in specs)
    assert any(s.alpha_warmup and s.beta3_warmup for s in specs)


def test_defaults_are_the_reference_class_s() -> None:
    spec = load_config({"optimizer": {"name": "ademamix"}}).optimizer
    assert spec.overrides() == {"lr": 1e-3, "betas": (0.9, 0.999), "beta3": 0.9999, "alpha": 2.0, "beta3_warmup": 0,
                                "alpha_warmup": 0, "eps": 1e-8, "weight_decay": 0.0, "maximize": False,
                                "cautious_weight_decay": False}  # twinstep's field, off as in the reference


@pytest.mark.parametrize(("optimizer", "message"), [
    ({"name": "ademamix", "beta3": 1.0}, "optimizer.beta3 must be in [0, 1)"),
    ({"name": "ademamix", "alpha": -1.0}, "optimizer.alpha must be >= 0"),
    ({"name": "ademamix", "alpha_warmup": -2}, "optimizer.alpha_warmup must be in [0, "),
    ({"name": "adam", "beta3": 0.99}, "optimizer.beta3 is only used when name is ademamix"),
    ({"name": "rmsprop", "alpha": 2.0}, "optimizer.alpha must be in [0, 1] for rmsprop"),
    ({"name": "ademamix", "decoupled_weight_decay": True}, "its weight decay is always decoupled"),
])
def test_bad_fields_are_one_line_config_errors(optimizer: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"optimizer": optimizer})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_alpha_above_1_is_adamix_s_mix_not_rmsprop_s_smoothing() -> None:
    assert load_config({"optimizer": {"name": "ademamix", "alpha": 8.0}}).optimizer.alpha == 8.0


def test_cycling_momentum_is_refused_naming_the_field() -> None:
    from conformance.rules.schedules import cycled_hyperparameter

    config = load_config({"optimizer": {"name": "ademamix"}, "schedule": {"name": "onecycle", "max_lr": 0.1,
                                                                           "total_steps": 10}})
    with pytest.raises(ConfigError, match=r"^schedule\.cycle_momentum = true is not supported with optimizer\.name"):
        cycled_hyperparameter(config.schedule, config.optimizer)


def test_the_oracle_s_warm_ups_are_the_hand_values() -> None:
    """α: α·t/T, then α. β3: at t/T = a the half-life is the blend of β1's and β3's, t ≥ T gives β3,
    and with β3 = β1 the ramp is flat at β1 + 1e-8 (the reference's guard inside the log)."""
    assert [oracle.ademamix_alpha(HP, t) for t in (1, 2, 3, 4, 9)] == [2.0, 4.0, 6.0, 8.0, 8.0]
    assert oracle.ademamix_beta3(HP, 6) == oracle.ademamix_beta3(HP, 60) == 0.9999
    half = lambda b, guard: math.log(0.5) / math.log(b + guard)  # noqa: E731  f(β) + 1, the half-life
    for t in (1, 3, 5):
        a = t / 6
        blend = (1 - a) * half(0.9, 1e-8) + a * half(0.9999, 1e-8)
        assert half(oracle.ademamix_beta3(HP, t), 0.0) == pytest.approx(blend, rel=1e-12)
    assert oracle.ademamix_beta3({**HP, "beta3": 0.9}, 1) == pytest.approx(0.9 + 1e-8, rel=1e-14)  # f⁻¹(f(β1))


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_the_twins_warm_ups_are_the_oracle_s(framework: str) -> None:
    if framework == "torch":
        from ref_torch import _ademamix
        at = lambda f, t: float(f(HP, float(t)))  # noqa: E731  torch's step is a float
    else:
        import jax

        from ref_jax import _ademamix

        def at(f, t):
            with jax.enable_x64(True):
                return float(f(HP, jax.numpy.asarray(float(t))))
    for t in range(1, 9):
        assert at(_ademamix.alpha_at, t) == pytest.approx(oracle.ademamix_alpha(HP, t), rel=1e-15)
        assert at(_ademamix.beta3_at, t) == pytest.approx(oracle.ademamix_beta3(HP, t), rel=1e-15)
    assert np.isfinite(at(_ademamix.beta3_at, 1))


@pytest.mark.parametrize("foreach", [False, True], ids=["per-tensor", "foreach"])
def test_the_torch_class_s_two_paths_are_the_oracle_s_with_counts_that_differ(foreach: bool) -> None:
    """Torch's AdEMAMix runs one foreach call per update count (CUDA's default) or one tensor at a
    time (the CPU's); a parameter without a gradient at update 1 lags one count behind, so its warm-ups
    are read at another t. Both paths follow the oracle's per-parameter equations (float64)."""
    import torch

    from ref_torch._ademamix import AdEMAMix

    hp = {**HP, "lr": 0.01, "eps": 1e-8, "weight_decay": 0.1, "maximize": False}
    rng = np.random.default_rng(7)
    p0 = [rng.normal(size=s) for s in ((3, 4), (5,), (2, 2))]
    params = [torch.nn.Parameter(torch.tensor(p)) for p in p0]
    opt = AdEMAMix(params, lr=hp["lr"], betas=hp["betas"], beta3=hp["beta3"], alpha=hp["alpha"],
                   beta3_warmup=hp["beta3_warmup"], alpha_warmup=hp["alpha_warmup"], eps=hp["eps"],
                   weight_decay=hp["weight_decay"], foreach=foreach)
    want, states = [p.copy() for p in p0], [oracle.init_state("ademamix", hp, p) for p in p0]
    for update in range(7):
        grads = [rng.normal(size=p.shape) for p in p0]
        for i, (param, g) in enumerate(zip(params, grads)):
            param.grad = None if (update == 0 and i == 1) else torch.tensor(g)
            if param.grad is not None:
                want[i], states[i] = oracle.update("ademamix", hp, want[i], g, states[i])
        opt.step()
    assert [float(opt.state[p]["step"]) for p in params] == [7.0, 6.0, 7.0]
    # the project's float64 bound, 1e-12 relative (docs/contract.md); measured 1.1e-16 on both paths.
    # atol 1e-14 is 2.6e-12 of the smallest weight here (3.9e-3): it hides no relative error
    for param, w in zip(params, want):
        np.testing.assert_allclose(param.detach().numpy(), w, rtol=1e-12, atol=1e-14)
