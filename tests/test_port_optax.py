"""from_optax: an optax-flavoured description as the neutral spec, keeping optax's semantics. The
reference is optax itself: the same description is built into optax's own transforms and schedules
(conformance.port.verify.native.build_optax, float64 counts) and run on the same gradient stream; twinstep's
torch and JAX backends must follow it at every update (1e-12 abs, 1e-10 rel)."""

from __future__ import annotations

import inspect

import pytest

from conformance.config import load_config
from conformance.errors import ConfigError, UnsupportedError
from conformance.harness.backends import Backend
from conformance.port import from_optax
from conformance.port.read.optax_desc import INJECT, REFUSED, REQUIRED, TRANSFORMS
from conformance.port.read.optax_sched import SCHEDULES
from conformance.port.verify.native import run_native_optax
from conformance.port.verify.traces import compare, gradient_stream, run_backend

SHAPES = {"enc.weight": (3, 4), "enc.bias": (3,), "head.weight": (2, 3)}
WARMUP_COSINE = {"warmup_cosine_decay_schedule": {"init_value": 0.0, "peak_value": 0.05, "warmup_steps": 3,
                                                  "decay_steps": 10, "end_value": 1e-3}}


def lr(schedule: dict) -> dict:
    return {"sgd": {"learning_rate": schedule, "momentum": 0.9}}


DESCRIPTIONS = {
    "issue-example": {"chain": [{"clip_by_global_norm": {"max_norm": 1.0}}, {"adamw": {
        "learning_rate": WARMUP_COSINE, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "eps_root": 0.0, "weight_decay": 1e-4}}]},
    "multisteps-adam-eps-root": {"MultiSteps": {"opt": {"chain": [{"clip_by_global_norm": {"max_norm": 0.5}},
                                                                  {"adam": {"learning_rate": 0.01, "eps_root": 1e-8}}]},
                                                "every_k_schedule": 3}},
    "rmsprop-defaults": {"rmsprop": {"learning_rate": 0.01}},
    "rmsprop-centered-momentum": {"rmsprop": {"learning_rate": 0.01, "decay": 0.9, "eps": 1e-3, "centered": True,
                                              "momentum": 0.9}},
    "rmsprop-torch-order-schedule": {"chain": [{"clip": {"max_delta": 0.3}}, {"scale_by_rms": {
        "decay": 0.99, "eps_in_sqrt": False}}, {"trace": {"decay": 0.9}}, {"scale_by_learning_rate": {
            "learning_rate": {"cosine_decay_schedule": {"init_value": 0.01, "decay_steps": 5, "alpha": 0.1}}}}]},
    "adagrad-defaults": {"adagrad": {"learning_rate": 0.1}},
    "sgd-nesterov-staircase": {"sgd": {"learning_rate": {"exponential_decay": {
        "init_value": 0.1, "transition_steps": 2, "decay_rate": 0.5, "staircase": True}}, "momentum": 0.9,
        "nesterov": True}},
    "maximize-l2-nadam": {"chain": [{"scale": {"step_size": -1.0}}, {"add_decayed_weights": {"weight_decay": 0.1}},
                                    {"nadam": {"learning_rate": 0.01}}]},
    "nadamw": {"nadamw": {"learning_rate": 0.01, "weight_decay": 0.05}},
    "amsgrad": {"amsgrad": {"learning_rate": 0.01}},
    "amsgrad-raw": {"amsgrad": {"learning_rate": 0.01, "bias_correction_nu": False}},
    "adamax": {"adamax": {"learning_rate": 0.01}},
    "lion-default-decay": {"lion": {"learning_rate": 0.01}},
    "exponential-delayed": lr({"exponential_decay": {"init_value": 0.1, "transition_steps": 3, "decay_rate": 0.5,
                                                     "transition_begin": 2}}),
    "piecewise-multistep": lr({"piecewise_constant_schedule": {"init_value": 0.1, "boundaries_and_scales":
                                                               {"3": 0.5, "6": 0.5}}}),
    "piecewise-general": lr({"piecewise_constant_schedule": {"init_value": 0.1, "boundaries_and_scales":
                                                             {"3": 0.5, "6": 0.1}}}),
    "linear-from-zero": lr({"linear_schedule": {"init_value": 0.0, "end_value": 0.1, "transition_steps": 4}}),
    "linear-delayed": lr({"linear_schedule": {"init_value": 0.1, "end_value": 0.01, "transition_steps": 4,
                                              "transition_begin": 2}}),
    "polynomial": lr({"polynomial_schedule": {"init_value": 0.1, "end_value": 0.0, "power": 2,
                                              "transition_steps": 6}}),
    "join-warmup-cosine": lr({"join_schedules": {"schedules": [
        {"linear_schedule": {"init_value": 0.0, "end_value": 0.1, "transition_steps": 3}},
        {"cosine_decay_schedule": {"init_value": 0.1, "decay_steps": 5}}], "boundaries": [3]}}),
    "cosine-onecycle": lr({"cosine_onecycle_schedule": {"transition_steps": 12, "peak_value": 0.1,
                                                        "pct_start": 0.25}}),
    "linear-onecycle": lr({"linear_onecycle_schedule": {"transition_steps": 12, "peak_value": 0.1,
                                                        "pct_start": 0.25, "pct_final": 0.5}}),
    "sgdr": lr({"sgdr_schedule": {"cosine_kwargs": [
        {"init_value": 0.01, "peak_value": 0.1, "warmup_steps": 1, "decay_steps": 4}] * 2}}),
    "warmup-exponential": lr({"warmup_exponential_decay_schedule": {
        "init_value": 0.01, "peak_value": 0.1, "warmup_steps": 2, "transition_steps": 2, "decay_rate": 0.5}}),
    "warmup-constant": lr({"warmup_constant_schedule": {"init_value": 0.01, "peak_value": 0.1, "warmup_steps": 2}}),
    # optax's end values and starts above the peak
    "polynomial-end-value": lr({"polynomial_schedule": {"init_value": 0.1, "end_value": 0.02, "power": 2,
                                                        "transition_steps": 6}}),
    "exponential-end-value": lr({"exponential_decay": {"init_value": 0.1, "transition_steps": 1, "decay_rate": 0.7,
                                                       "end_value": 0.03}}),
    "exponential-growth-ceiling": lr({"exponential_decay": {"init_value": 0.01, "transition_steps": 2,
                                                            "decay_rate": 1.5, "end_value": 0.05}}),
    "staircase-begin-end-value": lr({"exponential_decay": {"init_value": 0.1, "transition_steps": 2, "decay_rate": 0.5,
                                                           "transition_begin": 3, "staircase": True,
                                                           "end_value": 0.02}}),
    "linear-from-above-then-cosine": lr({"join_schedules": {"schedules": [
        {"linear_schedule": {"init_value": 0.3, "end_value": 0.1, "transition_steps": 3}},
        {"cosine_decay_schedule": {"init_value": 0.1, "decay_steps": 6}}], "boundaries": [3]}}),
    "linear-from-above-then-exponential": lr({"join_schedules": {"schedules": [
        {"linear_schedule": {"init_value": 0.5, "end_value": 0.2, "transition_steps": 4}},
        {"exponential_decay": {"init_value": 0.1, "transition_steps": 1, "decay_rate": 0.8}}], "boundaries": [5]}}),
    "warmup-cosine-from-above": lr({"warmup_cosine_decay_schedule": {"init_value": 0.2, "peak_value": 0.05,
                                                                     "warmup_steps": 3, "decay_steps": 10}}),
    "sgd-decoupled": {"chain": [{"trace": {"decay": 0.9}}, {"add_decayed_weights": {"weight_decay": 0.1}},
                                {"scale_by_learning_rate": {"learning_rate": 0.05}}]},
    "adamax-decoupled": {"chain": [{"scale_by_adamax": {}}, {"add_decayed_weights": {"weight_decay": 0.2}},
                                   {"scale_by_learning_rate": {"learning_rate": 0.01}}]},
    "schedule-free-adamw": {"schedule_free_adamw": {"learning_rate": 0.01, "weight_decay": 0.1, "b1": 0.8}},
    "schedule-free-sgd": {"chain": [{"clip_by_global_norm": {"max_norm": 1.0}},
                                    {"schedule_free_sgd": {"learning_rate": 0.1, "weight_lr_power": 1.0}}]},
    "ademamix": {"ademamix": {"learning_rate": 0.01, "b3": 0.99, "alpha": 3.0, "weight_decay": 0.1}},
    "ademamix-chain-schedule": {"chain": [{"clip_by_global_norm": {"max_norm": 1.0}},
                                          {"scale_by_ademamix": {"b1": 0.8, "b3": 0.95}},
                                          {"add_decayed_weights": {"weight_decay": 0.05}},
                                          {"scale_by_learning_rate": {"learning_rate": WARMUP_COSINE}}]},
    "prodigy": {"prodigy": {"learning_rate": 0.5, "estim_lr0": 1e-3, "weight_decay": 0.1}},
    # a warm-up from 0.01: at lr 0 optax.contrib.prodigy divides 0 by 0 where prodigyopt returns early (PR-BC)
    "prodigy-l2-clip-schedule": {"chain": [{"clip_by_global_norm": {"max_norm": 1.0}},
                                           {"add_decayed_weights": {"weight_decay": 0.1}},
                                           {"prodigy": {"learning_rate": {"warmup_cosine_decay_schedule": {
                                               **WARMUP_COSINE["warmup_cosine_decay_schedule"], "init_value": 0.01,
                                               "peak_value": 1.0}}, "betas": [0.8, 0.99],
                                                        "beta3": 0.9, "estim_lr0": 1e-3, "safeguard_warmup": True}}]},
    "inject-hyperparams-adamw": {"chain": [{"clip_by_global_norm": {"max_norm": 1.0}}, {"inject_hyperparams": {
        "adamw": {"learning_rate": WARMUP_COSINE, "b1": 0.85, "weight_decay": 0.01}, "static_args": ["b2"]}}]},
    "clip-value-then-norm": {"chain": [{"clip": {"max_delta": 0.3}}, {"clip_by_global_norm": {"max_norm": 0.5}},
                                       {"adam": {"learning_rate": 0.05}}]},
}


@pytest.mark.parametrize("name", sorted(DESCRIPTIONS))
def test_descriptions_follow_optax_itself_on_both_backends(name: str) -> None:
    description = DESCRIPTIONS[name]
    spec = from_optax({"optax": description})
    config = load_config({**spec, "precision": {"dtype": "float64"}})
    values = {k: v * 0.5 for k, v in gradient_stream(SHAPES, 1, seed=9)[0][0]["g"].items()}
    windows = gradient_stream(SHAPES, 12, micro=config.accumulation.steps)
    with Backend("jax").context():
        want = run_native_optax(description, values, windows)
    for backend in ("torch", "jax"):
        with Backend(backend).context():
            err, message = compare(run_backend(backend, config, values, windows), want)
        assert message is None, f"{backend}: {message} (spec {spec})"


def test_optax_semantics_become_explicit_fields() -> None:
    assert from_optax({"optax": {"rmsprop": {"learning_rate": 0.1}}})["optimizer"] == {
        "name": "rmsprop", "alpha": 0.9, "eps": 1e-8, "eps_in_sqrt": True, "centered": False, "momentum": 0.0,
        "weight_decay": 0.0, "lr": 0.1}
    adagrad = from_optax({"optax": {"adagrad": {"learning_rate": 0.1}}})["optimizer"]
    assert (adagrad["initial_accumulator_value"], adagrad["eps"], adagrad["eps_in_sqrt"]) == (0.1, 1e-7, True)
    assert from_optax({"optax": {"nadam": {"learning_rate": 0.1}}})["optimizer"]["momentum_schedule"] is False
    assert from_optax({"optax": {"amsgrad": {"learning_rate": 0.1}}})["optimizer"]["amsgrad_variant"] == "optax"
    issue = from_optax({"optax": DESCRIPTIONS["issue-example"]})
    assert issue["clip"] == {"max_norm": 1.0, "eps": 0.0}  # optax's clip has no eps
    assert issue["optimizer"]["weight_decay"] == 1e-4 and issue["optimizer"]["name"] == "adamw"
    assert issue["schedule"] == {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 10, "eta_min": 1e-3,
                                 "start_factor": 0.0, "convention": "optax"}


def test_end_values_and_starts_above_the_peak_are_fields() -> None:
    def schedule(name: str) -> dict:
        return from_optax({"optax": DESCRIPTIONS[name]})["schedule"]

    assert schedule("polynomial-end-value") == {"name": "polynomial", "total_iters": 6, "power": 2.0,
                                                "end_factor": 0.02 / 0.1}
    assert schedule("exponential-growth-ceiling")["end_factor"] == 5.0
    assert schedule("warmup-cosine-from-above")["start_factor"] == 4.0
    above = from_optax({"optax": DESCRIPTIONS["linear-from-above-then-exponential"]})
    assert above["optimizer"]["lr"] == 0.1  # the exponential's start is the base lr; the warm-up a factor above
    assert above["schedule"]["schedulers"][0] == {"name": "linear", "start_factor": 5.0, "end_factor": 2.0,
                                                  "total_iters": 4}


def test_a_toml_file_with_other_sections_becomes_a_whole_config(tmp_path) -> None:
    path = tmp_path / "optax.toml"
    path.write_text('[optax]\nno_weight_decay = ["*.bias"]\n\n[optax.MultiSteps]\nevery_k_schedule = 4\n'
                    'opt = {adamw = {learning_rate = 1e-3}}\n\n[model]\nname = "linear"\n')
    config = load_config(from_optax(path))
    assert config.accumulation.steps == 4 and config.model.name == "linear"
    assert config.optimizer.no_weight_decay == ["*.bias"]


@pytest.mark.parametrize("table, error, words", [
    ({"radam": {"learning_rate": 0.1}}, UnsupportedError, "optax.radam cannot be translated: optax.radam adds eps"),
    ({"adafactor": {}}, UnsupportedError, "optax.adafactor cannot be translated"),
    ({"chain": [{"apply_if_finite": {}}]}, UnsupportedError, "apply_if_finite cannot be translated"),
    ({"adamw": {"learning_rate": 0.1, "mask": "biases"}}, UnsupportedError, "mask is a Python function in optax"),
    ({"rmsprop": {"learning_rate": {"exponential_decay": {"init_value": 0.1, "transition_steps": 1,
                                                          "decay_rate": 0.9}}, "momentum": 0.9}},
     UnsupportedError, "applies the lr before its momentum trace"),
    ({"rmsprop": {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}}, UnsupportedError, "nesterov"),
    ({"adam": {"learning_rate": 0.1, "beta1": 0.9}}, ConfigError, r"optax.adam.beta1 is not an argument of optax.adam"),
    ({"adam": {"b1": 0.9}}, ConfigError, "optax.adam.learning_rate is required"),
    ({"adam": {"learning_rate": 0.1, "mu_dtype": "bfloat16"}}, UnsupportedError,
     r"optax.adam.mu_dtype = 'bfloat16': optax would keep that state in bfloat16; .* master dtype float32 "
     r"\(O-STATE-DTYPE\)"),
    ({"sgd": {"learning_rate": 0.1, "momentum": 0.9, "accumulator_dtype": "jnp.float16"}}, UnsupportedError,
     "accumulator_dtype = 'jnp.float16'"),
    ({"chain": [{"add_decayed_weights": {"weight_decay": 0.1}}, {"clip_by_global_norm": {"max_norm": 1.0}},
                {"sgd": {"learning_rate": 0.1}}]}, UnsupportedError, "clips g \\+ weight_decay"),
    ({"MultiSteps": {"opt": {"sgd": {"learning_rate": 0.1}}, "every_k_schedule": 2, "use_grad_mean": False}},
     UnsupportedError, "use_grad_mean = false sums"),
    ({"sgd": {"learning_rate": {"piecewise_interpolate_schedule": {}}}}, UnsupportedError, "piecewise_interpolate"),
    ({"sgd": {"learning_rate": {"cosine_decay_schedule": {"init_value": 0.1, "decay_steps": 5, "exponent": 2.0}}}},
     UnsupportedError, "exponent"),
    ({"fromage": {"learning_rate": 0.1}}, UnsupportedError, "twinstep reads the optax transforms"),
    ({"chain": [{"clip_by_global_norm": {"max_norm": 1.0}}, {"clip": {"max_delta": 0.3}}, {"sgd": {"learning_rate": 0.1}}]},
     UnsupportedError, "a second clipping transform; twinstep clips once, or by value then by norm"),
    ({"ademamix": {"learning_rate": 0.1, "alpha": {"linear_schedule": {"init_value": 0.0, "end_value": 5.0,
                                                                        "transition_steps": 10}}}},
     UnsupportedError, "ademamix.alpha: optax.contrib.ademamix calls its alpha schedule with the count before"),
    ({"chain": [{"zero_nans": {}}, {"adam": {"learning_rate": 0.1}}]}, UnsupportedError,
     "optax.zero_nans cannot be translated: .*P-IFFINITE"),
    ({"muon": {"learning_rate": 0.02}}, UnsupportedError, "optax.contrib.muon is another algorithm .*O-MUON"),
    ({"inject_hyperparams": {"adamw": {"learning_rate": 0.1}, "hyperparam_dtype": "float32"}}, UnsupportedError,
     "inject_hyperparams.hyperparam_dtype = 'float32': the injected hyper-parameters"),
    ({"inject_hyperparams": {"adamw": {"learning_rate": 0.1}, "sgd": {"learning_rate": 0.1}}}, ConfigError,
     "inject_hyperparams wraps one optax transform factory"),
    ({"ademamix": {"learning_rate": 0.1, "eps_root": 1e-8}}, UnsupportedError, "eps_root = 1e-08 has no spec field"),
    ({"chain": [{"add_decayed_weights": {"weight_decay": 0.1}}, {"scale_by_ademamix": {}},
                {"scale_by_learning_rate": {"learning_rate": 0.1}}]},
     UnsupportedError, "weight decay before scale_by_ademamix has no spec field"),
])
def test_what_the_spec_cannot_express_is_refused_in_one_line(table: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words) as info:
        from_optax({"optax": table})
    assert "\n" not in str(info.value)


def test_a_description_without_an_optax_table_is_refused() -> None:
    with pytest.raises(ConfigError, match="no \\[optax\\] table"):
        from_optax({"model": {"name": "linear"}})
    with pytest.raises(ConfigError, match="unknown section 'optimizer'"):
        from_optax({"optax": {"sgd": {"learning_rate": 0.1}}, "optimizer": {"name": "adam"}})


@pytest.mark.parametrize("name", sorted(set(TRANSFORMS) | set(SCHEDULES)))
def test_argument_tables_match_optax_signatures(name: str) -> None:
    import optax.contrib

    table = TRANSFORMS.get(name) or SCHEDULES[name]
    params = inspect.signature(getattr(optax, name, None) or getattr(optax.contrib, name)).parameters
    assert list(table) == list(params), name
    for key, default in table.items():
        want = params[key].default
        if default is REQUIRED:
            assert want is inspect.Parameter.empty, (name, key)
        elif key in ("dtype_momentum", "accumulator_dtype") and name in ("adafactor", "MultiSteps"):
            assert getattr(want, "__name__", want) == default
        else:
            assert want == default, (name, key, want)


def test_inject_hyperparams_arguments_and_the_refused_names_are_optax_s() -> None:
    import optax.contrib

    params = inspect.signature(optax.inject_hyperparams).parameters
    assert list(params) == ["inner_factory", *INJECT]
    assert all(params[k].default == v for k, v in INJECT.items())
    assert all(callable(getattr(optax, n, None) or getattr(optax.contrib, n, None)) for n in REFUSED)



def test_state_dtypes_read_when_they_name_the_master_dtype() -> None:
    """O-STATE-DTYPE: mu_dtype / accumulator_dtype equal to the master dtype change nothing and read
    as if unset; optax keeps another (bfloat16) in that dtype, which twinstep's state never is."""
    import jax.numpy as jnp
    import optax

    plain = from_optax({"optax": {"adam": {"learning_rate": 0.1}}})
    assert from_optax({"optax": {"adam": {"learning_rate": 0.1, "mu_dtype": "float32"}}}) == plain
    sgd = {"optax": {"sgd": {"learning_rate": 0.1, "momentum": 0.9, "accumulator_dtype": "jnp.float64"}},
           "precision": {"dtype": "float64"}}
    assert from_optax(sgd)["optimizer"]["momentum"] == 0.9
    with pytest.raises(UnsupportedError, match="master dtype float64"):
        from_optax({**sgd, "precision": {"dtype": "float64"}, "optax": {"adam": {"learning_rate": 0.1,
                                                                               "mu_dtype": "float32"}}})
    state = optax.adam(0.1, mu_dtype=jnp.bfloat16).init({"w": jnp.zeros(3, jnp.float32)})
    assert state[0].mu["w"].dtype == jnp.bfloat16 and state[0].nu["w"].dtype == jnp.float32
