"""Negative controls for the porting checks: a translation or snippet that drops an option (dampening,
eps placement, AMSGrad, a stepped scheduler's position, OneCycle's phase ends, Adagrad's accumulator,
the schedule hold on skipped updates, a transpose) must be caught by the same comparisons that pass
for the correct port."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.port import (
    SHAPES,
    float64_default,
    initial,
    native_run,
    on_backends,
    parameters,
)

from conformance.config import load_config
from conformance.harness.backends import Backend
from conformance.port import from_optax, from_torch
from conformance.port.read.weights import check, import_weights
from conformance.port.verify.native import run_native_optax, run_native_torch
from conformance.port.verify.traces import (
    Trace,
    compare,
    gradient_stream,
    run_backend,
    run_snippet,
)
from conformance.port.write.optax_code import optax_code
from conformance.port.write.torch_code import torch_code


def caught(spec: dict, values: dict, windows: list, want: Trace, position: int = 0) -> None:
    """Every backend's run of the (wrong) spec must fail the comparison with the native trajectory."""
    config = load_config({**spec, "precision": {"dtype": "float64"}})
    for name, trace in on_backends(config, values, windows, position).items():
        _, message = compare(trace, want)
        assert message is not None, f"{name}: the wrong translation went unnoticed"


def mutate(spec: dict, **fields) -> dict:
    return {**spec, "optimizer": {**spec["optimizer"], **fields}}


@pytest.mark.parametrize("kind, wrong", [
    ("sgd", {"dampening": 0.0}),                                   # dampening dropped
    ("rmsprop", {"eps_in_sqrt": True}),                            # optax's eps placement for torch's
    ("adam", {"amsgrad": False}),                                  # AMSGrad dropped
    ("adam", {"amsgrad_variant": "optax"}),                        # optax's AMSGrad for torch's
    ("nadam", {"momentum_schedule": False, "momentum_decay": 4e-3}),  # optax.nadam for torch's NAdam
    ("adagrad", {"initial_accumulator_value": 0.1}),               # optax's default accumulator
])
def test_a_translation_that_drops_an_option_is_caught(kind: str, wrong: dict) -> None:
    with float64_default():
        spec, position, values, windows, want = native_run(kind, "step")
    caught(mutate(spec, **wrong), values, windows, want, position)


def test_dropping_a_stepped_schedulers_position_is_caught() -> None:
    with float64_default():
        spec, position, values, windows, want = native_run("sgd-nesterov", "warmup-cosine", updates=6, pre_steps=4)
    assert position == 4
    caught(spec, values, windows, want, position=0)


def test_reading_the_current_lr_as_the_base_lr_is_caught() -> None:
    with float64_default():
        spec, position, values, windows, want = native_run("adam", "step", updates=6, pre_steps=4)
    current = spec["optimizer"]["lr"] * 0.5 ** 2  # StepLR(2, 0.5) after 4 steps: what group["lr"] holds
    caught(mutate(spec, lr=current), values, windows, want, position)


def test_optax_onecycle_boundaries_for_torch_ones_are_caught() -> None:
    with float64_default():
        spec, position, values, windows, want = native_run("sgd-nesterov", "onecycle", updates=12)
    table = dict(spec["schedule"])
    table["pct_start"] = int(table["pct_start"] * table["total_steps"]) / table["total_steps"] + 1 / table["total_steps"]
    caught({**spec, "schedule": table}, values, windows, want, position)


def test_ignoring_torch_adagrads_constructor_accumulator_is_caught() -> None:
    values = initial()
    with float64_default():
        named = parameters(values)
        opt = torch.optim.Adagrad([{"params": [named["enc.bias"], named["head.bias"]], "initial_accumulator_value": 5.0},
                                   {"params": [named["enc.weight"], named["head.weight"]]}], lr=0.1)
        spec = dict(from_torch(opt, None, named))
        windows = gradient_stream(SHAPES, 6)
        want = run_native_torch(opt, None, named, windows)
    groups = [{**spec["optimizer"]["groups"][0], "initial_accumulator_value": 5.0}]  # what the group dict says
    caught(mutate(spec, groups=groups), values, windows, want)


# ------------------------------------------------------------------ from optax

OPTAX = {
    "rmsprop": {"rmsprop": {"learning_rate": 0.01, "eps": 1e-3}},
    "adagrad": {"adagrad": {"learning_rate": 0.1}},
    "clip": {"chain": [{"clip_by_global_norm": {"max_norm": 0.5}}, {"sgd": {"learning_rate": 0.1}}]},
    "cosine": {"sgd": {"learning_rate": {"cosine_decay_schedule": {"init_value": 0.1, "decay_steps": 4}}}},
}


@pytest.mark.parametrize("name, wrong", [
    ("rmsprop", lambda s: mutate(s, eps_in_sqrt=False)),                                # torch's eps placement
    ("adagrad", lambda s: mutate(s, eps_in_sqrt=False, initial_accumulator_value=0.0, eps=1e-10)),  # torch's
    ("clip", lambda s: {**s, "clip": {"max_norm": 0.5}}),                               # torch's clip eps 1e-6
    ("cosine", lambda s: {**s, "schedule": {"name": "cosine", "t_max": 4}}),            # torch's cosine past t_max
])
def test_an_optax_translation_with_torchs_semantics_is_caught(name: str, wrong) -> None:
    spec = dict(from_optax({"optax": OPTAX[name]}))
    values = {k: v for k, v in initial().items()}
    windows = gradient_stream(SHAPES, 10, scale=3.0)
    with Backend("jax").context():
        want = run_native_optax(OPTAX[name], values, windows)
    caught(wrong(spec), values, windows, want)


def test_the_rmsprop_alias_order_under_a_schedule_really_differs() -> None:
    # why from_optax refuses rmsprop(momentum) with a schedule: reading it as torch's order is wrong
    sched_desc = {"exponential_decay": {"init_value": 0.05, "transition_steps": 1, "decay_rate": 0.7}}
    alias = {"rmsprop": {"learning_rate": sched_desc, "momentum": 0.9}}
    torch_order = {"chain": [{"scale_by_rms": {}}, {"trace": {"decay": 0.9}},
                             {"scale_by_learning_rate": {"learning_rate": sched_desc}}]}
    values, windows = initial(), gradient_stream(SHAPES, 8)
    with Backend("jax").context():
        want = run_native_optax(alias, values, windows)
    caught(dict(from_optax({"optax": torch_order})), values, windows, want)


# ------------------------------------------------------------------ snippets

CONFIG = {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "dampening": 0.4,
                        "groups": [{"params": ["*.bias"], "lr": 0.05}]},
          "schedule": {"name": "step", "step_size": 2, "gamma": 0.5}, "clip": {"max_norm": 0.5},
          "accumulation": {"steps": 2}, "precision": {"dtype": "float64", "loss_scale": "dynamic",
                                                      "init_scale": 1024.0, "growth_interval": 2}}


@pytest.mark.parametrize("framework, old, new", [
    ("torch", 'if finite:  # schedule_on_skip = "hold"', "if True:"),                      # schedule on skips
    ("torch", "torch.nn.utils.clip_grads_with_norm_(self.params, 0.5, norm)", "pass"),    # clipping dropped
    ("torch", "/ len(window)", "/ 2"),                                                     # incomplete window
    ("optax", "torch_momentum(0.9, 0.4, False)", "optax.trace(decay=0.9)"),                # dampening dropped
    ("optax", "jnp.asarray(finite, jnp.int32)", "jnp.asarray(True, jnp.int32)"),          # schedule on skips
    ("optax", "clip_by_norm_torch(0.5, 1e-06", "clip_by_norm_torch(0.5, 0.0"),            # optax's clip rule
])
def test_a_snippet_with_a_dropped_detail_is_caught(framework: str, old: str, new: str) -> None:
    config = load_config(CONFIG)
    code = (torch_code if framework == "torch" else optax_code)(config)
    assert old in code
    mutant = code.replace(old, new)
    values = initial()
    windows = gradient_stream(SHAPES, 7, micro=2, poison=[2], last=1)
    backend = "torch" if framework == "torch" else "jax"
    with Backend(backend).context():
        want = run_backend(backend, config, values, windows)
        assert compare(run_snippet(framework, code, config, values, windows), want)[1] is None
        assert compare(run_snippet(framework, mutant, config, values, windows), want)[1] is not None


def test_the_comparison_is_tight() -> None:
    values = initial()
    trace = Trace([values], [{}], [False], [])
    nudged = Trace([{**values, "enc.bias": values["enc.bias"] * (1 + 1e-9)}], [{}], [False], [])
    assert compare(nudged, trace)[1] is not None and compare(trace, trace)[1] is None


# ------------------------------------------------------------------ weights


def test_hf_weights_read_without_the_transpose_are_caught() -> None:
    from test_port_weights import GPT, hf_layout, neutral, torch_model

    model = torch_model(GPT)
    state = {k: v.numpy() for k, v in hf_layout(model.state_dict(), prefix=True).items()}
    with pytest.raises(Exception, match="has shape"):
        import_weights(state, GPT, fmt="torch", dtype="float64")  # c_attn is [d, 3d]: caught by its shape
    # the square c_proj would slip through a shape check: the values catch it
    wrong = {k: v for k, v in neutral(model).items()}
    wrong["transformer.h.0.attn.c_proj.weight"] = wrong["transformer.h.0.attn.c_proj.weight"].T
    got = import_weights(state, GPT, fmt="hf", dtype="float64")
    assert not np.array_equal(check(GPT, wrong, "float64")["transformer.h.0.attn.c_proj.weight"],
                              got["transformer.h.0.attn.c_proj.weight"])
