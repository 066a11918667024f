"""Optimizers: the spec (torch defaults, errors), parameter groups, and torch == jax == oracle on random
hyper-parameters and gradient streams (float64 to 1e-12, float32 within the pinned drift), with the
edge cases: zero-size and frozen parameters, missing gradients, large step counts, maximize."""

from __future__ import annotations

import inspect
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from support.optimizers import BACKENDS, random_spec, run_all, spec_of, worst

from conformance.config import load_config
from conformance.config.optimizer import (
    DEFAULTS,
    OPTIMIZER_NAMES,
    USED_BY,
    OptimizerSpec,
)
from conformance.errors import ConfigError, InputError
from conformance.oracle import optimizers as oracle
from conformance.rules.groups import group_layout, resolve_groups
from ref_jax import optimizers as jo
from ref_torch import _assembly
from ref_torch import optimizers as to

TORCH_CLASSES = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
                 "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad, "adamax": torch.optim.Adamax,
                 "nadam": torch.optim.NAdam, "radam": torch.optim.RAdam, "adafactor": torch.optim.Adafactor,
                 "muon": torch.optim.Muon}


# ---------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TORCH_CLASSES))
def test_defaults_are_torch_defaults(name: str) -> None:
    signature = inspect.signature(TORCH_CLASSES[name]).parameters
    spec = spec_of({"name": name}).overrides()
    for key, param in signature.items():
        if key in ("params", "foreach", "fused", "capturable", "differentiable"):
            continue
        want = param.default
        if name == "adafactor" and key == "eps":
            want = ("auto", want[1])
        if name == "muon" and key == "adjust_lr_fn":
            want = "original"  # torch's None means "original"
        assert spec[key] == want, f"{name}.{key}: spec {spec[key]!r}, torch {want!r}"
    assert set(spec) - set(signature) <= {"eps_root", "amsgrad_variant", "eps_in_sqrt", "momentum_schedule",
                                          "ns_dtype", "decoupled_weight_decay", "eps_hat", "cautious_weight_decay"}



def test_lion_defaults_are_lucidrains() -> None:
    assert spec_of({"name": "lion"}).overrides() == {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0,
                                                     "maximize": False, "cautious": False,
                                                     "cautious_weight_decay": False}


@pytest.mark.parametrize(("table", "message"), [
    ({"name": "sgd", "betas": [0.9, 0.99]}, "optimizer.betas is only used when name is adam"),
    ({"name": "sgd", "nesterov": True}, "optimizer.nesterov needs momentum > 0 and dampening = 0"),
    ({"name": "adamw", "cautious": True}, "optimizer.cautious is only used when name is lion"),
    ({"name": "sgd", "momentum": 0.9, "dampening": 0.1, "nesterov": True}, "optimizer.nesterov needs"),
    ({"name": "adam", "betas": [0.9, 1.0]}, "optimizer.betas[1] must be in [0, 1); received 1.0"),
    ({"name": "adam", "lr": -1.0}, "optimizer.lr must be >= 0; received -1.0"),
    ({"name": "adam", "amsgrad_variant": "optax"}, "optimizer.amsgrad_variant is only used with amsgrad = true"),
    ({"name": "adamw", "decoupled_weight_decay": False},
     "optimizer.decoupled_weight_decay is not used with name = 'adamw': its weight decay is always decoupled"),
    ({"name": "adam", "eps_hat": True, "eps_root": 1e-8}, "optimizer.eps_hat cannot be combined with eps_root = 1e-08"),
    ({"name": "adam", "eps_root": 1e-8, "groups": [{"params": ["a"], "eps_hat": True}]},
     "optimizer.groups[0].eps_hat cannot be combined with eps_root"),
    ({"name": "adam", "eps_hat": True, "amsgrad": True, "amsgrad_variant": "optax"},
     "optimizer.eps_hat is only defined with amsgrad_variant = 'torch'"),
    ({"name": "radam", "eps_hat": True}, "optimizer.eps_hat is only used when name is adam, adamw, adamax, nadam"),
    ({"name": "lion", "decoupled_weight_decay": True}, "its weight decay is always decoupled"),
    ({"name": "schedule_free_sgd", "momentum": 0.0}, "optimizer.momentum must be in (0, 1) for schedule_free_sgd"),
    ({"name": "schedule_free_adamw", "warmup_steps": -1}, "optimizer.warmup_steps must be in [0, 2^63 - 1]"),
    ({"name": "schedule_free_adamw", "warmup_steps": 1.5}, "optimizer.warmup_steps"),
    ({"name": "schedule_free_adamw", "r": -1.0}, "optimizer.r must be >= 0"),
    ({"name": "schedule_free_adamw", "maximize": True}, "optimizer.maximize is only used when name is"),
    ({"name": "adam", "warmup_steps": 5}, "optimizer.warmup_steps is only used when name is schedule_free_adamw"),
    ({"name": "adam", "eps": [1e-3, 1e-3]}, "optimizer.eps must be a number for adam"),
    ({"name": "adafactor", "eps": 1e-3}, "optimizer.eps must be torch's pair"),
    ({"name": "adafactor", "d": 0.5}, "optimizer.d must be >= 1"),
    ({"name": "adafactor", "beta2_decay": 0.5}, "optimizer.beta2_decay must be <= 0"),
    ({"name": "rmsprop", "alpha": 1.5}, "optimizer.alpha must be in [0, 1]"),
    ({"name": "muon", "maximize": True}, "optimizer.maximize is only used when name is sgd"),
    ({"name": "muon", "fallback": {"name": "muon"}}, "optimizer.fallback.name must not be muon"),
    ({"name": "muon", "ns_steps": 100}, "optimizer.ns_steps must be in [0, 99]"),
    ({"name": "adam", "fallback_params": ["x"]}, "optimizer.fallback_params is only used when name is muon"),
    ({"name": "adam", "groups": [{"params": ["a"], "momentum": 0.9}]}, "optimizer.groups[0].momentum is only used"),
    ({"name": "sgd", "momentum": 0.9, "groups": [{"params": ["a"], "nesterov": True, "dampening": 0.5}]},
     "optimizer.groups[0].nesterov needs"),
    ({"name": "adam", "groups": [{"params": []}]}, "optimizer.groups[0].params"),
    ({"name": "adam", "lrr": 0.1}, "optimizer.lrr is not a known key (did you mean 'lr'?)"),
    ({"name": "nadam", "momentum_schedule": False, "momentum_decay": 0.1}, "optimizer.momentum_decay is not used"),
])
def test_spec_errors_name_the_field(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"optimizer": table})
    assert message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_resolved_config_round_trips(name: str) -> None:
    import tomllib

    from conformance.config import dump_config

    lr = 0.0 if name == "prodigy" else 0.5  # prodigy's groups take its lr or 0
    config = load_config({"optimizer": {"name": name, "groups": [{"params": ["*"], "lr": lr}]}})
    assert load_config(tomllib.loads(dump_config(config))) == config
    assert set(config.optimizer.overrides()) == set(DEFAULTS[name])  # every value in force, nothing else


# ---------------------------------------------------------------------------------------------
# parameter groups
# ---------------------------------------------------------------------------------------------

SHAPES = {"embed.weight": (5, 3), "h.0.attn.weight": (3, 3), "h.0.attn.bias": (3,), "h.0.ln.weight": (3,),
          "head.weight": (3, 2), "head.bias": (2,)}


def test_groups_by_glob_and_default_group_last() -> None:
    spec = spec_of({"name": "adamw", "groups": [{"params": ["h.*"], "lr": 0.1}, {"params": ["head.*"], "betas": [0.5, 0.9]}]})
    groups = resolve_groups(spec, SHAPES)
    assert [g.label for g in groups] == ["groups[0]", "groups[1]", "default"]
    assert [g.names for g in groups] == [("h.0.attn.weight", "h.0.attn.bias", "h.0.ln.weight"),
                                        ("head.weight", "head.bias"), ("embed.weight",)]
    assert [g.hyperparams["lr"] for g in groups] == [0.1, 1e-3, 1e-3]
    assert groups[1].hyperparams["betas"] == (0.5, 0.9) and groups[2].hyperparams["betas"] == (0.9, 0.999)


def test_no_weight_decay_is_one_line() -> None:
    spec = spec_of({"name": "adamw", "weight_decay": 0.1, "no_weight_decay": ["*.bias", "*ln.weight"]})
    groups = resolve_groups(spec, SHAPES)
    assert [(g.label, g.hyperparams["weight_decay"]) for g in groups] == [("default", 0.1), ("default.no_decay", 0.0)]
    assert set(groups[1].names) == {"h.0.attn.bias", "h.0.ln.weight", "head.bias"}


def test_muon_routes_matrices_and_fallback_params() -> None:
    spec = spec_of({"name": "muon", "lr": 0.02, "fallback_params": ["embed.*"], "fallback": {"name": "adamw", "lr": 3e-4}})
    groups = resolve_groups(spec, SHAPES)
    assert [(g.label, g.optimizer, g.hyperparams["lr"]) for g in groups] == [
        ("default", "muon", 0.02), ("default.fallback", "adamw", 3e-4)]
    assert groups[0].names == ("h.0.attn.weight", "head.weight")
    assert "embed.weight" in groups[1].names


@pytest.mark.parametrize(("table", "message"), [
    ({"groups": [{"params": ["enc.*"]}]}, "optimizer.groups[0].params[0] = 'enc.*' matches no parameter"),
    ({"groups": [{"params": ["*.bias"]}, {"params": ["head.*"]}]},
     "parameter 'head.bias' is matched by optimizer.groups[0] ('*.bias') and optimizer.groups[1] ('head.*')"),
    ({"no_weight_decay": ["*norm*"]}, "optimizer.no_weight_decay[0] = '*norm*' matches no parameter"),
])
def test_group_pattern_errors(table: dict, message: str, framework) -> None:
    spec = spec_of({"name": "adam", **table})
    params = {k: np.zeros(s) for k, s in SHAPES.items()}
    with pytest.raises(ConfigError) as err:
        framework.function("optimizers", "run_trajectory")(spec, params, grads=[])
    assert message in str(err.value)


def test_torch_param_groups_follow_the_layout() -> None:
    spec = spec_of({"name": "muon", "no_weight_decay": ["*.bias"], "groups": [{"params": ["h.*"], "lr": 0.01}]})
    named = {k: torch.nn.Parameter(torch.zeros(s)) for k, s in SHAPES.items()}
    opt = to.build_optimizer(spec, named.items())
    assert [g["label"] for g in opt.param_groups] == [g.label for g in group_layout(spec)]
    assert [tuple(g["param_names"]) for g in opt.param_groups] == [g.names for g in resolve_groups(spec, SHAPES)]
    assert isinstance(opt, torch.optim.Optimizer)


@pytest.mark.parametrize("impl", ["single", "foreach", "fused"])
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "adagrad", "rmsprop", "nadam", "radam", "adamax", "adafactor"])
def test_torch_kernels_agree(name: str, impl: str) -> None:
    """torch's for-loop, foreach and fused (CPU) kernels: the same numbers to a few ulps."""
    spec = spec_of({"name": name, **({"momentum": 0.9} if name in ("sgd", "rmsprop") else {}),
                    "weight_decay": 0.01})
    rng = np.random.default_rng(0)
    results = []
    w0 = torch.tensor(rng.standard_normal((3, 4)))
    for kernel in ("single", impl):
        named = {"w": torch.nn.Parameter(w0.clone())}
        opt = _assembly.make(spec, named.items(), impl=kernel)
        for g in np.random.default_rng(1).standard_normal((5, 3, 4)):
            named["w"].grad = torch.tensor(g)
            opt.step()
        results.append(named["w"].detach().numpy().copy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# torch == jax == oracle
# ---------------------------------------------------------------------------------------------


@given(st.data())
def test_random_trajectories_agree_in_float64(data) -> None:
    """Random optimizer, options, groups and a 20-update gradient stream with missing gradients."""
    spec, params, grads = data.draw(random_spec(updates=20))
    out = run_all(spec, params, grads, "float64")
    assert worst(out["torch"], out["oracle"]) <= 1e-12
    assert worst(out["jax"], out["oracle"]) <= 1e-12


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_each_optimizer_agrees_over_20_updates(name: str) -> None:
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # a fixed seed per optimizer (hash() is salted)
    extra = {"muon": {"ns_dtype": "float64"}}.get(name, {})
    spec = spec_of({"name": name, "lr": 0.05, "weight_decay": 0.05, **extra})
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(20)]
    del grads[3]["b"], grads[7]["w"]
    out = run_all(spec, params, grads, "float64")
    assert worst(out["torch"], out["oracle"]) <= 1e-12 and worst(out["jax"], out["oracle"]) <= 1e-12


def test_worst_refuses_trajectories_that_do_not_line_up() -> None:
    """The error measure's negative control: a trajectory cut short (or one update longer), a missing
    or extra parameter and a missing state entry are infinitely wrong, not compared over the overlap."""
    spec = spec_of({"name": "adam", "lr": 0.05})
    rng = np.random.default_rng(7)
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(5)]
    want = run_all(spec, params, grads, "float64", backends=("oracle",))["oracle"]
    assert worst(want, want) == 0.0
    short = {"params": want["params"][:-1], "state": want["state"][:-1]}
    longer = {"params": [*want["params"], want["params"][-1]], "state": [*want["state"], want["state"][-1]]}
    for got in (short, longer):
        assert worst(got, want) == np.inf and worst(got, want, states=False) == np.inf
    assert worst({**want, "state": want["state"][:-1]}, want) == np.inf  # the parameters alone line up
    assert worst({**want, "params": [{**p, "extra": p["w"]} for p in want["params"]]}, want) == np.inf
    assert worst({**want, "params": [{"w": p["w"]} for p in want["params"]]}, want) == np.inf
    assert worst({**want, "state": [{k: {} for k in s} for s in want["state"]]}, want) == np.inf


# Measured max |torch - jax| / max |p| over 20 updates in float32 (tests/support/optimizers.py data),
# 2.9e-7 at worst (lion, sgd, muon); pinned at 1e-6: more means one side changed its arithmetic.
FLOAT32_DRIFT = 1e-6


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_float32_drift_is_pinned(name: str) -> None:
    rng = np.random.default_rng(1)
    spec = spec_of({"name": name, "lr": 0.01, **({"weight_decay": 0.1} if name != "muon" else {})})
    params = {"w": rng.standard_normal((4, 5)), "b": rng.standard_normal(5)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(20)]
    out = run_all(spec, params, grads, "float32", backends=("torch", "jax"))
    drift = worst(out["torch"], out["jax"], states=False)
    assert drift <= FLOAT32_DRIFT, f"{name}: float32 torch vs jax drift {drift:.2e}"


def test_muon_float32_newton_schulz_agrees_to_float32() -> None:
    spec = spec_of({"name": "muon", "ns_dtype": "float32", "lr": 0.02})
    rng = np.random.default_rng(5)
    params = {"w": rng.standard_normal((4, 3))}
    grads = [{"w": rng.standard_normal((4, 3))} for _ in range(10)]
    out = run_all(spec, params, grads, "float64")
    assert worst(out["torch"], out["jax"]) < 1e-6 and worst(out["jax"], out["oracle"]) < 1e-6


# ---------------------------------------------------------------------------------------------
# edge cases
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_missing_gradient_leaves_parameter_and_state_untouched(name: str, backend) -> None:
    spec = spec_of({"name": name, "weight_decay": 0.1})
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((2, 3)), "b": rng.standard_normal(3)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(3)]
    del grads[1]["w"]
    out = backend.function("optimizers", "run_trajectory")(spec, params, grads)
    np.testing.assert_array_equal(out["params"][1]["w"], out["params"][0]["w"])
    shared = ("d", "d_max", "d_numerator", "k") if name == "prodigy" else ()  # Prodigy's one d moves with b's update
    for key, value in out["state"][0]["w"].items():
        want = out["state"][1]["b"][key] if key in shared else value
        np.testing.assert_array_equal(out["state"][1]["w"][key], want)
    assert int(out["state"][1]["w"]["step"]) == 1 and int(out["state"][1]["b"]["step"]) == 2
    assert int(out["state"][2]["w"]["step"]) == 2


def test_an_update_without_any_gradient_changes_nothing(backend) -> None:
    spec = spec_of({"name": "adamw", "weight_decay": 0.5})
    params = {"w": np.array([1.0, -2.0])}
    out = backend.function("optimizers", "run_trajectory")(spec, params, [{}, {"w": np.array([0.1, 0.2])}, {}])
    np.testing.assert_array_equal(out["params"][0]["w"], params["w"])
    assert out["state"][0] == {}
    np.testing.assert_array_equal(out["params"][2]["w"], out["params"][1]["w"])


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_zero_size_parameters_are_left_out(name: str, backend) -> None:
    shape = (0, 3) if name == "muon" else (0,)
    spec = spec_of({"name": name})
    params = {"w": np.ones((2, 3)), "empty": np.zeros(shape)}
    grads = [{"w": np.full((2, 3), 0.5), "empty": np.zeros(shape)}] * 2
    out = backend.function("optimizers", "run_trajectory")(spec, params, grads)
    assert out["params"][1]["empty"].shape == shape and "empty" not in out["state"][1]
    assert not np.array_equal(out["params"][1]["w"], params["w"])


def test_torch_frozen_parameters_match_jax_absent_gradients() -> None:
    spec = spec_of({"name": "adam", "lr": 0.1, "weight_decay": 0.1, "decoupled_weight_decay": True})
    frozen = torch.nn.Parameter(torch.ones(3, dtype=torch.float64), requires_grad=False)
    live = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt = to.build_optimizer(spec, [("frozen", frozen), ("live", live)])
    tx = jo.build_optimizer(spec, {"frozen": np.ones(3), "live": np.ones(2)})
    import jax.numpy as jnp
    import optax

    from ref_jax.backend import context

    with context():
        p = {"frozen": jnp.ones(3), "live": jnp.ones(2)}
        s = tx.init(p)
        for _ in range(3):
            live.grad = torch.full((2,), 0.3, dtype=torch.float64)
            opt.step()
            u, s = tx.update({"frozen": jnp.zeros(3), "live": jnp.full(2, 0.3)}, s, p, present={"frozen": False, "live": True})
            p = optax.apply_updates(p, u)
        assert np.array_equal(np.asarray(p["frozen"]), np.ones(3)) and torch.equal(frozen, torch.ones(3, dtype=torch.float64))
        np.testing.assert_allclose(np.asarray(p["live"]), live.detach().numpy(), rtol=1e-15)
        assert "frozen" not in jo.export_state(s)["state"] and "frozen" not in to.export_state(opt)["state"]


@pytest.mark.parametrize("name", ["adam", "adamw", "nadam", "radam", "adamax", "adagrad", "adafactor", "rmsprop"])
def test_large_step_counts(name: str) -> None:
    """Bias corrections at t = 10^6 (state imported at that count): float64 counts on every side."""
    spec = spec_of({"name": name, "lr": 0.01})
    rng = np.random.default_rng(7)
    params = {"w": rng.standard_normal((2, 3))}
    start = oracle.run_trajectory(spec, params, [{"w": rng.standard_normal((2, 3))}])["state"][0]
    start["w"]["step"] = np.asarray(1_000_000)
    grads = [{"w": rng.standard_normal((2, 3))} for _ in range(3)]
    out = run_all(spec, params, grads, "float64", state=start)
    assert int(out["torch"]["state"][-1]["w"]["step"]) == 1_000_003
    assert worst(out["torch"], out["oracle"]) <= 1e-12 and worst(out["jax"], out["oracle"]) <= 1e-12


@pytest.mark.parametrize("name", USED_BY["maximize"])
def test_maximize_equals_minimizing_the_negated_gradient(name: str, backend) -> None:
    rng = np.random.default_rng(11)
    params = {"w": rng.standard_normal((2, 3))}
    grads = [{"w": rng.standard_normal((2, 3))} for _ in range(4)]
    run = backend.function("optimizers", "run_trajectory")
    up = run(spec_of({"name": name, "maximize": True, "weight_decay": 0.1}), params, grads)
    down = run(spec_of({"name": name, "weight_decay": 0.1}), params, [{"w": -g["w"]} for g in grads])
    np.testing.assert_allclose(up["params"][-1]["w"], down["params"][-1]["w"], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize(("grads", "message"), [
    ([{"w": np.array([np.nan, 1.0])}], "grads[0]['w'] contains a non-finite value"),
    ([{"w": np.ones(3)}], "grads[0]['w'] has shape (3,); the parameter has shape (2,)"),
    ([{"v": np.ones(2)}], "grads[0] names parameter 'v', which params does not have"),
])
def test_bad_inputs_raise_the_same_error(grads: list, message: str, backend) -> None:
    with pytest.raises(InputError) as err:
        backend.function("optimizers", "run_trajectory")(spec_of({"name": "sgd"}), {"w": np.ones(2)}, grads)
    assert message in str(err.value)


def test_spec_type() -> None:
    assert isinstance(spec_of({"name": "sgd"}), OptimizerSpec) and BACKENDS == ("torch", "jax", "oracle")


def test_adagrad_group_initial_accumulator_value_is_honoured() -> None:
    """torch.optim.Adagrad would use the constructor's value for every group; twinstep the group's."""
    spec = spec_of({"name": "adagrad", "lr": 0.1, "groups": [{"params": ["b"], "initial_accumulator_value": 0.5}]})
    params = {"a": np.array([1.0, -1.0]), "b": np.array([2.0, 0.5])}
    grads = [{"a": np.array([0.3, 0.1]), "b": np.array([-0.2, 0.4])}] * 3
    out = run_all(spec, params, grads)
    assert worst(out["torch"], out["oracle"]) <= 1e-12 and worst(out["jax"], out["oracle"]) <= 1e-12
    np.testing.assert_allclose(out["oracle"]["state"][0]["b"]["sum"], 0.5 + grads[0]["b"] ** 2)


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_float16_parameters_stay_within_the_float16_tolerance(name: str) -> None:
    """Half-precision parameters and states: torch rounds after every kernel, the JAX twin once per
    update; both stay within the float16 case tolerance of the float64 oracle over 5 updates."""
    from conformance.harness.arrays import round_to

    rng = np.random.default_rng(1)
    params = {"w": round_to(rng.standard_normal((4, 5)), "float16"), "b": round_to(rng.standard_normal(5), "float16")}
    grads = [{k: round_to(rng.standard_normal(v.shape), "float16") for k, v in params.items()} for _ in range(5)]
    spec = spec_of({"name": name, "lr": 0.01, **({"momentum": 0.9} if name in ("sgd", "rmsprop") else {})})
    out = run_all(spec, params, grads, "float16")
    for side in ("torch", "jax"):
        for got, want in zip(out[side]["params"], out["oracle"]["params"]):
            for k in want:
                np.testing.assert_allclose(got[k], want[k], atol=1e-3, rtol=1e-2, err_msg=f"{side} {k}")
