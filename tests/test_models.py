"""The built-in models: neutral names and layouts, identical initial weights, the same forward pass
on torch, JAX and the NumPy oracle, sizes (GPT-2 small = 124,439,808 parameters), weight files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from conformance.config import load_config
from conformance.config.model import ModelSpec
from conformance.data import DataPipeline
from conformance.errors import InputError, UnsupportedError
from conformance.harness.backends import Backend
from conformance.oracle import models as oracle
from conformance.rules.models import (
    flops_per_token,
    init_params,
    param_count,
    param_shapes,
)
from ref_jax import models as jm
from ref_jax.backend import context as jax_context
from ref_torch import models as tm

TINY_GPT = dict(name="gpt", vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)
SPECS = {
    "linear": ModelSpec(name="linear", in_features=3, out_features=2),
    "mlp-seed": ModelSpec(name="mlp", in_features=20, out_features=2),
    "mlp-deep-relu-nonorm": ModelSpec(name="mlp", in_features=5, out_features=4, hidden=[7, 6], activation="relu",
                                      norm="none"),
    "mlp-tanh-nobias": ModelSpec(name="mlp", in_features=5, out_features=3, hidden=[6], activation="tanh", bias=False),
    "gpt": ModelSpec(**TINY_GPT),
    "gpt-nobias": ModelSpec(**TINY_GPT, bias=False),
}
F64_REL = 1e-12
F32_REL = 2e-6  # measured worst 4.8e-7 (≈4 float32 ulps of the largest output) over 6 seeds × 4 models


def inputs(spec: ModelSpec, seed: int = 0, batch: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if spec.name == "gpt":
        return rng.integers(0, spec.vocab_size, (batch, spec.block_size))
    return rng.normal(size=(batch, spec.in_features))


def perturbed(spec: ModelSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial values plus noise, so LayerNorm weights and biases are not the trivial 1 and 0."""
    rng = np.random.default_rng(seed + 100)
    return {k: v + 0.3 * rng.normal(size=v.shape) for k, v in init_params(spec, None, seed).items()}


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


# --- names, layouts, sizes ---------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(SPECS))
def test_same_names_and_shapes_everywhere(key: str) -> None:
    spec = SPECS[key]
    expected = param_shapes(spec, None)
    t = tm.build_model(spec, None)
    j = jm.build_model(spec, None)
    assert [(n, tuple(p.shape)) for n, p in tm.named_parameters(t).items()] == list(expected.items())
    assert [(n, tuple(p.shape)) for n, p in jm.named_parameters(j).items()] == list(expected.items())


def test_mlp_is_the_seed_classifier_and_linear_is_nn_linear() -> None:
    # Seed 000's model and seed 001's, built from torch's own modules: same names and shapes.
    seed_mlp = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 2))
    assert {n: tuple(p.shape) for n, p in seed_mlp.named_parameters()} == param_shapes(SPECS["mlp-seed"], None)
    seed_lin = nn.Linear(1, 1)
    assert {n: tuple(p.shape) for n, p in seed_lin.named_parameters()} == param_shapes(
        ModelSpec(name="linear", in_features=1, out_features=1), None)


def test_default_mlp_takes_its_sizes_from_the_data() -> None:
    data = DataPipeline(load_config({"data": {"name": "digits"}}))
    assert param_shapes(ModelSpec(), data.info)["0.weight"] == (64, 64)
    assert param_shapes(ModelSpec(), data.info)["3.weight"] == (10, 64)


def test_gpt2_small_size_and_flops() -> None:
    spec = ModelSpec(name="gpt", n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)
    assert param_count(spec, None) == 124_439_808  # GPT-2 small (HF "gpt2") with the tied lm_head once
    assert param_count(spec, None, non_embedding=True) == 123_653_376  # nanoGPT's "123.65M"
    with torch.device("meta"):
        model = tm.GPT(50257, 1024, 12, 12, 768)
    assert sum(p.numel() for p in model.parameters()) == 124_439_808
    shapes = jm.nnx.eval_shape(lambda: jm.GPT(50257, 1024, 12, 12, 768))
    assert sum(math.prod(v.shape) for _, v in jm.nnx.to_flat_state(jm.nnx.state(shapes, jm.nnx.Param))) == 124_439_808
    # 6N + 12·L·d·T with N = 123,653,376, L = 12, d = 768, T = 1024
    assert flops_per_token(spec, None) == 6 * 123_653_376 + 12 * 12 * 768 * 1024


def test_flops_per_token_by_hand() -> None:
    spec = ModelSpec(name="gpt", vocab_size=10, block_size=4, n_layer=2, n_head=2, n_embd=8)
    # wte 80; per block: ln 16 + c_attn 216 + c_proj 72 + ln 16 + c_fc 288 + c_proj 264 = 872; ln_f 16
    assert param_count(spec, None, non_embedding=True) == 80 + 2 * 872 + 16 == 1840
    assert flops_per_token(spec, None) == 6 * 1840 + 12 * 2 * 8 * 4


# --- initialization ----------------------------------------------------------------------------


def test_init_follows_the_documented_distributions() -> None:
    spec = ModelSpec(name="gpt", vocab_size=50, block_size=16, n_layer=3, n_head=4, n_embd=64)
    p = init_params(spec, None, seed=1)
    assert abs(p["transformer.h.0.attn.c_attn.weight"].std() - 0.02) < 0.001
    assert abs(p["transformer.h.1.mlp.c_proj.weight"].std() - 0.02 / math.sqrt(6)) < 0.0005
    assert not p["transformer.h.0.attn.c_attn.bias"].any() and np.all(p["transformer.ln_f.weight"] == 1)
    m = init_params(SPECS["mlp-seed"], None, seed=1)
    bound = 1 / math.sqrt(20)
    assert np.abs(m["0.weight"]).max() <= bound and np.abs(m["0.weight"]).max() > 0.95 * bound
    assert np.abs(m["3.bias"]).max() <= 1 / math.sqrt(64)
    assert np.all(m["2.weight"] == 1) and not m["2.bias"].any()


def test_init_is_seeded_per_parameter() -> None:
    a = init_params(SPECS["mlp-seed"], None, seed=5)
    assert all(np.array_equal(a[k], v) for k, v in init_params(SPECS["mlp-seed"], None, seed=5).items())
    assert not np.array_equal(a["0.weight"], init_params(SPECS["mlp-seed"], None, seed=6)["0.weight"])
    deeper = init_params(ModelSpec(name="mlp", in_features=20, out_features=2, hidden=[64, 32]), None, seed=5)
    assert np.array_equal(deeper["0.weight"], a["0.weight"])  # adding a layer leaves the others alone


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("key", ["mlp-seed", "gpt"])
def test_both_frameworks_start_from_the_same_weights(key: str, dtype: str) -> None:
    from ref_jax import checkpoint as jc
    from ref_torch import checkpoint as tc

    spec = SPECS[key]
    with jax_context():
        t = tc.model_state(tm.build_model(spec, None, 3, dtype))
        j = jc.model_state(jm.build_model(spec, None, 3, dtype))
    for name, value in init_params(spec, None, 3).items():
        assert t[name].dtype == j[name].dtype == np.dtype(dtype)
        assert np.array_equal(t[name], value.astype(dtype)) and np.array_equal(j[name], t[name])


def test_torch_build_leaves_the_global_generator_alone() -> None:
    before = torch.get_rng_state()
    tm.build_model(SPECS["gpt"], None)
    assert torch.equal(before, torch.get_rng_state())


def test_jax_float64_needs_x64_mode() -> None:
    import jax

    with jax.enable_x64(False), pytest.raises(UnsupportedError, match="64-bit"):
        jm.build_model(SPECS["linear"], None, dtype="float64")


# --- the forward pass --------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(SPECS))
def test_forward_float64_agrees_three_ways(key: str, framework: Backend) -> None:
    spec, params = SPECS[key], perturbed(SPECS[key])
    x = inputs(spec)
    want = oracle.forward(spec, params, x)
    got = framework.function("models", "forward")(spec, params, x, "float64")
    assert got.shape == want.shape and rel_err(got, want) <= F64_REL


@pytest.mark.parametrize("key", ["mlp-seed", "gpt"])
def test_forward_float32_within_the_pinned_bound(key: str) -> None:
    spec, params = SPECS[key], init_params(SPECS[key], None, 0)
    x = inputs(spec, batch=8)
    want = oracle.forward(spec, params, x)
    with jax_context():
        t, j = tm.forward(spec, params, x, "float32"), jm.forward(spec, params, x, "float32")
    assert max(rel_err(t, want), rel_err(j, want), rel_err(t, j)) <= F32_REL


def test_seed_module_outputs_are_reproduced(framework: Backend) -> None:
    # torch's own modules in float64 as the independent reference, with torch's default init.
    torch.manual_seed(42)
    seed_mlp = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 2)).double()
    with torch.no_grad():  # non-trivial LayerNorm parameters
        seed_mlp[2].weight.uniform_(0.5, 1.5)
        seed_mlp[2].bias.uniform_(-0.5, 0.5)
    params = {n: p.detach().numpy() for n, p in seed_mlp.named_parameters()}
    x = np.random.default_rng(1).normal(size=(8, 20))
    want = seed_mlp(torch.from_numpy(x)).detach().numpy()
    assert rel_err(framework.function("models", "forward")(SPECS["mlp-seed"], params, x, "float64"), want) <= F64_REL


def forward_check(got: np.ndarray, want: np.ndarray) -> bool:
    return rel_err(got, want) <= F64_REL


def test_negative_controls_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    spec, params = SPECS["gpt"], perturbed(SPECS["gpt"])
    x = inputs(spec)
    want = oracle.forward(spec, params, x)
    # 1. a transposed square weight passes every shape check but not the forward check
    swapped = dict(params, **{"transformer.h.0.attn.c_proj.weight": params["transformer.h.0.attn.c_proj.weight"].T})
    assert not forward_check(tm.forward(spec, swapped, x), want)
    # 2. the tanh-approximate GELU (jax.nn.gelu's default) instead of torch's exact one
    real = jm._activation
    monkeypatch.setattr(jm, "_activation", lambda name, z: jm.jax.nn.gelu(z, approximate=True))
    with jax_context():
        assert not forward_check(jm.forward(spec, params, x), want)
    monkeypatch.setattr(jm, "_activation", real)
    # 3. LayerNorm eps 1e-6 (flax's default) instead of torch's 1e-5
    monkeypatch.setattr(jm, "LN_EPS", 1e-6)
    with jax_context():
        assert not forward_check(jm.forward(spec, params, x), want)
    # 4. attention without the causal mask
    monkeypatch.setattr(oracle.np, "tril", lambda m: np.ones_like(m))
    assert not forward_check(oracle.forward(spec, params, x), tm.forward(spec, params, x))


@pytest.mark.parametrize("name", ["torch", "jax", "oracle"])
def test_bad_inputs_raise_the_same_error(name: str) -> None:
    b = Backend(name)
    forward = b.function("models", "forward")
    spec, params = SPECS["gpt"], init_params(SPECS["gpt"], None, 0)
    cases = [
        (np.array([[0, 13]]), "token 13 at index (0, 1) is out of range 0..12"),
        (np.zeros((1, 9), np.int64), "has 9 positions; block_size is 8"),
        (np.zeros((1, 4)), "must be integer token ids"),
    ]
    with b.context():
        for x, message in cases:
            with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
                forward(spec, params, x)
        with pytest.raises(InputError, match="'transformer.wpe.weight' is missing"):
            without = {k: v for k, v in params.items() if k != "transformer.wpe.weight"}
            forward(spec, without, np.zeros((1, 2), np.int64))
        with pytest.raises(InputError, match="8 features"):
            forward(ModelSpec(name="linear", in_features=8, out_features=1), {"weight": np.zeros((1, 8)),
                    "bias": np.zeros(1)}, np.zeros((2, 3)))


# --- dropout, functional form, weight files ----------------------------------------------------


def test_dropout_only_in_training() -> None:
    small = ModelSpec(**{**TINY_GPT, "n_layer": 1})
    spec = small.model_copy(update={"dropout": 0.2})
    x = inputs(spec)
    plain = tm.build_model(small, None).eval()
    model = tm.build_model(spec, None)
    with torch.no_grad():
        ref = plain(torch.from_numpy(x))
        assert torch.equal(model.eval()(torch.from_numpy(x)), ref)
        assert not torch.equal(model.train()(torch.from_numpy(x)), ref)
    f = jm.jax.jit(jm.functional(jm.build_model(spec, None)))
    params, key = jm.named_parameters(jm.build_model(small, None)), jm.jax.random.key(0)
    assert np.array_equal(f(params, x), jm.jax.jit(jm.functional(jm.build_model(small, None)))(params, x))
    assert not np.array_equal(f(params, x, key), f(params, x)) and np.array_equal(f(params, x, key), f(params, x, key))


def test_functional_form_equals_the_module() -> None:
    spec = SPECS["gpt"]
    x = inputs(spec)
    t = tm.build_model(spec, None).eval()
    with torch.no_grad():
        assert torch.equal(tm.functional(t)(tm.named_parameters(t), torch.from_numpy(x)), t(torch.from_numpy(x)))
    j = jm.build_model(spec, None)
    assert np.allclose(jm.jax.jit(jm.functional(j))(jm.named_parameters(j), x), j(x), rtol=1e-6, atol=1e-6)


def test_weights_move_between_frameworks_as_safetensors(tmp_path) -> None:
    from safetensors.torch import load_file

    from ref_jax import checkpoint as jc
    from ref_torch import checkpoint as tc

    spec = SPECS["gpt"]
    t = tm.build_model(spec, None, seed=1).eval()
    tc.export_weights(t, tmp_path / "w.safetensors")
    # An independent reader sees the neutral names and torch's own values.
    plain = load_file(str(tmp_path / "w.safetensors"))
    assert list(plain) == sorted(param_shapes(spec, None)) or set(plain) == set(param_shapes(spec, None))
    assert torch.equal(plain["transformer.wte.weight"], t.transformer.wte.weight.detach())
    j = jm.build_model(spec, None, seed=2)
    jc.import_weights(j, tmp_path / "w.safetensors")
    x = inputs(spec)
    with torch.no_grad():
        assert np.allclose(np.asarray(j(x)), t(torch.from_numpy(x)).numpy(), rtol=0, atol=F32_REL * 10)
