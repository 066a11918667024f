"""[schedule.hyper] written out and read back: the torch and optax snippets `twinstep port` writes set
every scheduled hyper-parameter as twinstep's own backends do (control: the snippet of the config
without them differs), optax descriptions with `inject_hyperparams` schedules read into the spec and
run as optax itself does, the optax-native backend's inject_hyperparams is torch's math once its
int32 count is float64 (S-INT32), and HF TrainingArguments refuse what they cannot say.
"""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest

from conformance.config import load_config

pytestmark = pytest.mark.usefixtures("persistent_xla_cache", "one_thread")
ROOT = Path(__file__).resolve().parent.parent
WARMUP = {"name": "linear", "start_factor": 0.85 / 0.95, "end_factor": 1.0, "total_iters": 10}

SNIPPET_SHAPES = {"enc.weight": (3, 4), "enc.bias": (3,), "head.weight": (2, 3), "head.bias": (2,)}
SNIPPETS = {
    "muon-momentum-warmup-wd": ({"name": "muon", "lr": 0.02, "momentum": 0.95, "weight_decay": 0.01},
                                {"name": "cosine", "t_max": 9, "hyper": {"momentum": WARMUP, "weight_decay": {
                                    "name": "cosine", "t_max": 9}}}, {"steps": 2}),
    "adam-betas-per-epoch": ({"name": "adam", "lr": 0.01, "betas": [0.9, 0.99],
                              "groups": [{"params": ["*.bias"], "betas": [0.8, 0.95]}]},
                             {"name": "step", "step_size": 2, "unit": "epoch", "hyper": {
                                 "beta1": {"name": "exponential", "gamma": 0.9},
                                 "beta2": {"name": "linear", "start_factor": 0.9, "total_iters": 2}}}, {"steps": 1}),
    "sgd-plateau-momentum": ({"name": "sgd", "lr": 0.05, "momentum": 0.9},
                             {"name": "reduce_on_plateau", "hyper": {"momentum": {"name": "tabulated",
                                                                                 "factors": [0.5, 0.8, 1.0]}}},
                             {"steps": 2}),
    "adam-eps": ({"name": "adam", "lr": 0.01, "eps": 1e-3},
                               {"name": "constant", "hyper": {"eps": {"name": "exponential", "gamma": 0.7}}},
                               {"steps": 1}),
    "rmsprop-alpha-eps": ({"name": "rmsprop", "lr": 0.01, "alpha": 0.95, "centered": True, "momentum": 0.5},
                          {"name": "cosine", "t_max": 9, "hyper": {"alpha": {"name": "linear", "start_factor": 0.9,
                                                                            "total_iters": 4},
                                                                  "eps": {"name": "cosine", "t_max": 9}}}, {"steps": 1}),
    "sgd-dampening": ({"name": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.5},
                      {"name": "constant", "hyper": {"dampening": {"name": "cosine", "t_max": 9}}}, {"steps": 2}),
    "ademamix-beta3-alpha": ({"name": "ademamix", "lr": 0.01, "beta3": 0.99, "alpha": 3.0, "alpha_warmup": 4},
                             {"name": "constant", "hyper": {"beta3": {"name": "linear", "start_factor": 0.95,
                                                                      "total_iters": 5},
                                                            "alpha": {"name": "exponential", "gamma": 0.9}}},
                             {"steps": 1}),
}


@pytest.mark.parametrize("framework", ["torch", "optax"])
@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_the_snippets_set_the_scheduled_hyper_parameters(name: str, framework: str) -> None:
    from conformance.harness.backends import Backend
    from conformance.port.verify.traces import compare, gradient_stream, run_backend, run_snippet
    from conformance.port.write.optax_code import optax_code
    from conformance.port.write.torch_code import torch_code

    optimizer, schedule, accumulation = SNIPPETS[name]
    upe = 3 if schedule.get("unit") == "epoch" else 1
    rng = np.random.default_rng(3)
    values = {k: rng.normal(size=s) for k, s in SNIPPET_SHAPES.items()}
    windows = gradient_stream(SNIPPET_SHAPES, 9, micro=accumulation["steps"], poison=(4,), last=None)
    configs = {hyper: load_config({"optimizer": optimizer, "accumulation": accumulation, "precision": {"dtype": "float64"},
                                   "schedule": schedule if hyper else {k: v for k, v in schedule.items() if k != "hyper"}})
               for hyper in (True, False)}  # control: the snippet of the config without the hyper schedules
    backend, make = ("torch", torch_code) if framework == "torch" else ("jax", optax_code)
    with Backend(backend).context():
        want = run_backend(backend, configs[True], values, windows, updates_per_epoch=upe)
    results = {}
    for hyper, config in configs.items():
        with Backend(backend).context():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                results[hyper] = run_snippet(framework, make(config, "test", upe), config, values, windows)
            assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]  # the stand-ins are quiet
    assert compare(results[True], want, 1e-12, 1e-10)[1] is None
    assert compare(results[False], want, 1e-12, 1e-10)[1] is not None


def test_training_arguments_refuse_it() -> None:
    from conformance.errors import UnsupportedError
    from conformance.port.write.hf_args import hf_arguments

    with pytest.raises(UnsupportedError, match="schedule.hyper"):
        hf_arguments(load_config({"optimizer": {"name": "adamw"}, "schedule": {"name": "constant", "hyper": {
            "weight_decay": {"name": "linear", "total_iters": 3}}}, "run": {"max_updates": 10}}))


@pytest.mark.parametrize("name", ["torch-sgd-momentum-warmup", "torch-adam-beta2-warmup-beta1-decay",
                                  "torch-adamw-wd-follows-lr", "torch-adam-eps-decay"])
def test_optax_inject_hyperparams_is_the_same_math_at_float64_counts(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the optax-native backend schedules b1 / b2 / momentum / weight_decay through inject_hyperparams;
    # the two cases it fails differ only by S-INT32 (optax's schedules of an int32 count are float32):
    # with the count cast to float64 first, optax's own transforms give torch's values
    import jax
    import jax.numpy as jnp

    from natives.optax_native import update as native

    real = native.schedule_fn
    monkeypatch.setattr(native, "schedule_fn", lambda spec, b, n, upe=1: (
        lambda count, fn=real(spec, b, n, upe): fn(jnp.asarray(count, jnp.float64))))
    data = tomllib.loads((ROOT / "conformance" / "cases" / "optimizer" / "update" / f"{name}.toml").read_text())
    windows = [[{"g": g, "count": 1.0, "poison": 1.0}] for g in data["inputs"]["grads"]]
    params = {k: np.asarray(v, np.float64) for k, v in data["inputs"]["params"].items()}
    for keep in (True, False):  # control: without the hyper schedules optax's run is another
        schedule = data["schedule"] if keep else {k: v for k, v in data["schedule"].items() if k != "hyper"}
        config = load_config({"optimizer": data["optimizer"], "schedule": schedule, "precision": {"dtype": "float64"}})
        with jax.enable_x64(True):
            got = native.run_updates(config, params, windows)["params"]
        worst = max(float(np.max(np.abs(got[t][k] - np.asarray(data["expected"]["params"][t][k]))))
                    for t in range(len(windows)) for k in params)
        assert (worst < 1e-14) is keep, (keep, worst)


LINEAR_B1 = {"linear_schedule": {"init_value": 0.85, "end_value": 0.95, "transition_steps": 5}}
OPTAX_WRITTEN = {  # optax.inject_hyperparams(alias)(...) with schedules for other arguments than the lr
    "adamw-b1-warmup-wd-cosine": {"inject_hyperparams": {"adamw": {
        "learning_rate": {"cosine_decay_schedule": {"init_value": 0.05, "decay_steps": 12}}, "b1": LINEAR_B1,
        "weight_decay": {"cosine_decay_schedule": {"init_value": 0.1, "decay_steps": 12}}}}},
    "sgd-momentum-warmup": {"inject_hyperparams": {"sgd": {"learning_rate": 0.1, "nesterov": True, "momentum": {
        "linear_schedule": {"init_value": 0.85, "end_value": 0.95, "transition_steps": 4}}}, "static_args": ["nesterov"]}},
    "adam-b2-exponential": {"inject_hyperparams": {"adam": {"learning_rate": 0.02, "b2": {
        "exponential_decay": {"init_value": 0.999, "transition_steps": 1, "decay_rate": 0.99}}}}},
    "adam-eps-exponential": {"inject_hyperparams": {"adam": {"learning_rate": 0.02, "eps": {
        "exponential_decay": {"init_value": 0.05, "transition_steps": 1, "decay_rate": 0.7}}}}},
    "rmsprop-decay-warmup": {"inject_hyperparams": {"rmsprop": {"learning_rate": 0.01, "decay": {
        "linear_schedule": {"init_value": 0.8, "end_value": 0.95, "transition_steps": 5}}}}},
}


@pytest.mark.parametrize("name", sorted(OPTAX_WRITTEN))
def test_optax_written_with_scheduled_hyper_parameters_ports_exactly(name: str) -> None:
    # the reference is optax itself (conformance.port.verify.native: the same description built into
    # optax's transforms, schedules at float64 counts); control: the spec without its hyper schedules
    from conformance.harness.backends import Backend
    from conformance.port import from_optax
    from conformance.port.verify.native import run_native_optax
    from conformance.port.verify.traces import compare, gradient_stream, run_backend

    spec = from_optax({"optax": OPTAX_WRITTEN[name]})
    assert spec["schedule"]["hyper"]
    values = {k: v * 0.5 for k, v in gradient_stream(SNIPPET_SHAPES, 1, seed=9)[0][0]["g"].items()}
    windows = gradient_stream(SNIPPET_SHAPES, 10)
    with Backend("jax").context():
        want = run_native_optax(OPTAX_WRITTEN[name], values, windows)
    plain = {**spec, "schedule": {k: v for k, v in spec["schedule"].items() if k != "hyper"}}
    for backend in ("torch", "jax"):
        with Backend(backend).context():
            ok = compare(run_backend(backend, load_config({**spec, "precision": {"dtype": "float64"}}), values,
                                     windows), want)[1]
            off = compare(run_backend(backend, load_config({**plain, "precision": {"dtype": "float64"}}), values,
                                      windows), want)[1]
        assert ok is None and off is not None, (backend, ok)


def test_a_schedule_outside_inject_hyperparams_is_refused() -> None:
    from conformance.errors import UnsupportedError
    from conformance.port import from_optax

    with pytest.raises(UnsupportedError, match=r"optax.adam.b1 is a schedule: .* wrap the transform in "
                                               r"inject_hyperparams"):
        from_optax({"optax": {"adam": {"learning_rate": 0.1, "b1": LINEAR_B1}}})
