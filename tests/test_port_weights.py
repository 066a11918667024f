"""Foreign weights into the neutral format for the built-in models: torch state_dicts (safetensors,
.pt read with weights_only=True, nanoGPT checkpoints, DDP / torch.compile prefixes), Hugging Face
GPT-2's Conv1D layout, and Flax trees (real flax.linen modules, msgpack). Where a framework can
compute the model (torch modules, flax.linen), the imported weights must reproduce its outputs;
every problem is one InputError line naming the tensor."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax.serialization import msgpack_serialize

from conformance.checkpoint.files import save_tensors
from conformance.config.model import ModelSpec
from conformance.errors import InputError
from conformance.harness.backends import Backend
from conformance.port.read.weights import import_weights
from conformance.rules.models import param_shapes
from ref_torch import checkpoint as tck
from ref_torch import models as tmodels

GPT = ModelSpec(name="gpt", n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=13)
MLP = ModelSpec(name="mlp", in_features=5, out_features=3, hidden=[6, 4])
LINEAR = ModelSpec(name="linear", in_features=4, out_features=2)


def torch_model(spec: ModelSpec, seed: int = 1) -> torch.nn.Module:
    return tmodels.build_model(spec, None, seed=seed, dtype="float64")


def neutral(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return tck.model_state(model)


def hf_layout(state: dict[str, torch.Tensor], prefix: bool) -> dict[str, torch.Tensor]:
    """A Hugging Face GPT2LMHeadModel / GPT2Model state_dict: Conv1D weights [in, out], mask buffers."""
    out = {}
    for k, v in state.items():
        if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            v = v.T.contiguous()
        out[k if prefix or k.startswith("lm_head") else k.removeprefix("transformer.")] = v
    for i in range(GPT.n_layer):
        pre = "transformer." if prefix else ""
        out[f"{pre}h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
        out[f"{pre}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    if not prefix:
        out.pop("lm_head.weight")
    return out


@pytest.mark.parametrize("spec", [LINEAR, MLP, GPT], ids=lambda s: s.name)
def test_a_torch_state_dict_file_imports_exactly(spec: ModelSpec, tmp_path) -> None:
    model = torch_model(spec)
    path = tmp_path / "model.pt"
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, path)  # DDP names
    got = import_weights(path, spec, dtype="float64")
    want = neutral(model)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_a_nanogpt_checkpoint_with_optimizer_state_and_compile_prefix(tmp_path) -> None:
    model = torch_model(GPT)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = {"model": {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, "optimizer": opt.state_dict(),
            "model_args": {"n_layer": 2}, "iter_num": 5, "best_val_loss": 1.5}
    path = tmp_path / "ckpt.pt"
    torch.save(ckpt, path)
    got = import_weights(path, GPT, dtype="float64")
    name = "transformer.h.1.mlp.c_fc.weight"
    np.testing.assert_array_equal(got[name], neutral(model)[name])


def test_a_pickle_that_needs_code_is_refused(tmp_path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"model": torch_model(LINEAR).state_dict(), "extra": np.random.default_rng(0)}, path)
    with pytest.raises(InputError, match="not a torch state_dict that loads with weights_only=True"):
        import_weights(path, LINEAR)


@pytest.mark.parametrize("prefix", [True, False], ids=["lm-head-model", "base-model"])
def test_hugging_face_gpt2_layout_is_transposed(prefix: bool, tmp_path) -> None:
    model = torch_model(GPT)
    state = hf_layout(model.state_dict(), prefix)
    path = tmp_path / "hf.safetensors"
    save_tensors(path, {k: v.numpy() for k, v in state.items()})
    got = import_weights(path, GPT, dtype="float64")
    want = neutral(model)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    # HF's Conv1D computes x @ W + b with W [in, out]: the neutral weight must give the same map
    pre = "transformer." if prefix else ""
    for name in ("h.0.attn.c_attn", "h.0.attn.c_proj", "h.1.mlp.c_fc", "h.1.mlp.c_proj"):
        w_hf, b = state[f"{pre}{name}.weight"], state[f"{pre}{name}.bias"]
        x = torch.randn(3, w_hf.shape[0], dtype=torch.float64)
        w = torch.from_numpy(got[f"transformer.{name}.weight"])
        torch.testing.assert_close(torch.nn.functional.linear(x, w, b), x @ w_hf + b, rtol=0, atol=1e-15)


class LinenMLP(nn.Module):
    """twinstep's mlp in flax.linen: Dense, exact GELU, LayerNorm (eps 1e-5, two-pass variance)."""

    sequential: bool

    @nn.compact
    def __call__(self, x):
        layers = [nn.Dense(6), lambda y: nn.gelu(y, approximate=False),
                  nn.LayerNorm(epsilon=1e-5, use_fast_variance=False), nn.Dense(4),
                  lambda y: nn.gelu(y, approximate=False), nn.LayerNorm(epsilon=1e-5, use_fast_variance=False),
                  nn.Dense(3)]
        if self.sequential:
            return nn.Sequential(layers)(x)
        for layer in layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("sequential", [True, False], ids=["layers_i", "Dense_i"])
def test_a_flax_linen_mlp_reproduces_its_outputs_after_import(sequential: bool, tmp_path) -> None:
    with Backend("jax").context():
        module = LinenMLP(sequential)
        x = np.random.default_rng(2).normal(size=(7, 5))
        params = module.init(jax.random.PRNGKey(0), jnp.asarray(x))
        params = jax.tree.map(lambda v: v + 0.1 * jax.random.normal(jax.random.PRNGKey(1), v.shape, v.dtype), params)
        want = np.asarray(module.apply(params, jnp.asarray(x)))
        path = tmp_path / "params.msgpack"
        path.write_bytes(msgpack_serialize(jax.tree.map(np.asarray, params)))
    got = import_weights(path, MLP, dtype="float64")
    out = tmodels.forward(MLP, got, x, dtype="float64")
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)


def test_a_flax_dense_and_a_nested_dict_import_for_linear() -> None:
    with Backend("jax").context():
        dense = nn.Dense(2)
        x = np.random.default_rng(3).normal(size=(4, 4))
        params = dense.init(jax.random.PRNGKey(0), jnp.asarray(x))
        want = np.asarray(dense.apply(params, jnp.asarray(x)))
    got = import_weights(jax.tree.map(np.asarray, params), LINEAR, dtype="float64")
    np.testing.assert_allclose(tmodels.forward(LINEAR, got, x), want, rtol=1e-12, atol=1e-13)


def test_a_flax_gpt_tree_with_kernels_imports() -> None:
    want = neutral(torch_model(GPT))
    tree: dict = {}
    for name, value in want.items():
        *path, leaf = name.removeprefix("transformer.").split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        kind = "embedding" if path[-1] in ("wte", "wpe") else "scale" if path[-1].startswith("ln") else "kernel"
        node[leaf if leaf == "bias" else kind] = value.T if kind == "kernel" else value
    got = import_weights({"params": tree}, GPT, dtype="float64")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_imported_weights_load_into_both_frameworks(tmp_path) -> None:
    model = tmodels.build_model(MLP, None, seed=1, dtype="float32")  # the usual float32 state_dict
    path = tmp_path / "w.pt"
    torch.save(model.state_dict(), path)
    out = tmp_path / "neutral.safetensors"
    save_tensors(out, import_weights(path, MLP, dtype="float32"))
    fresh = tmodels.build_model(MLP, None, seed=5, dtype="float32")
    tck.import_weights(fresh, out)
    from ref_jax import checkpoint as jck
    from ref_jax import models as jmodels

    jmodel = jmodels.build_model(MLP, None, seed=5, dtype="float32")
    jck.import_weights(jmodel, out)
    np.testing.assert_array_equal(jck.model_state(jmodel)["3.weight"], tck.model_state(fresh)["3.weight"])
    np.testing.assert_array_equal(tck.model_state(fresh)["3.weight"], neutral(model)["3.weight"])


def _state(spec: ModelSpec) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in torch_model(spec).state_dict().items()}


@pytest.mark.parametrize("edit, words", [
    (lambda s: s.pop("0.bias"), "weight '0.bias' is missing"),
    (lambda s: s.update({"5.running_mean": np.zeros(4), "9.weight": np.zeros(2)}),
     "weights '5.running_mean', '9.weight' are not parameters of the built-in mlp"),
    (lambda s: s.update({"2.weight": np.zeros(5)}), r"weight '2.weight' has shape \(5,\); the model needs \(6,\)"),
    (lambda s: s.update({"0.weight": s["0.weight"].astype(np.float64) + 1e-12}),
     "weight '0.weight' \\(float64\\) does not convert to float32 exactly"),
    (lambda s: s.update({"0.bias": np.arange(6)}), "weight '0.bias' has dtype int64; expected floating-point"),
])
def test_bad_weights_are_refused_naming_the_tensor(edit, words: str) -> None:
    state = _state(MLP)
    edit(state)
    with pytest.raises(InputError, match=words) as info:
        import_weights(state, MLP, fmt="torch", dtype="float32")
    assert "\n" not in str(info.value)


def test_an_untied_head_and_a_config_mismatch_are_refused() -> None:
    state = _state(GPT)
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(InputError, match="'lm_head.weight' differs from 'transformer.wte.weight'"):
        import_weights(state, GPT, dtype="float64")
    with pytest.raises(InputError, match="model.block_size = 16 but the weights have 8"):
        import_weights(_state(GPT), GPT.model_copy(update={"block_size": 16}), dtype="float64")


def test_unknown_files_are_refused(tmp_path) -> None:
    path = tmp_path / "w.pkl"
    path.write_bytes(b"\x80\x04N.")
    with pytest.raises(InputError, match="unknown weight file type '.pkl'"):
        import_weights(path, LINEAR)
    bad = tmp_path / "w.msgpack"
    bad.write_bytes(b"\xc1\xc1")
    with pytest.raises(InputError, match="not a Flax msgpack file"):
        import_weights(bad, LINEAR)
    assert list(param_shapes(LINEAR, None)) == ["weight", "bias"]
