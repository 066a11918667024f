"""`[model] init`: a fresh run starts from pretrained weights (conformance/run/pretrained.py), on
both trainers.

A run trains a tiny gpt and is exported as a Hugging Face GPT-2 directory (with the zero biases
GPT-2 always has, for a bias-free model); a run with `init` pointing at it starts at the trained
model's loss: its first update's loss equals the loss of those weights on the same window, computed
here with F.cross_entropy (control: without init the loss is the untrained ln 65). The same weights
load from the checkpoint directory and from a torch .pt state_dict. A resume does not read the file
again (it is deleted before resuming; the resumed run equals an uninterrupted one). A GPT-2 that
transformers itself initialises and saves (non-zero biases) starts a run at the loss transformers
computes for it. Refusals name model.init and the problem.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.lm import mean_token_loss
from support.trainers import Trainer, trainer  # noqa: F401  (the fixture)

from conformance.cli import main
from conformance.config import load_config
from conformance.data import DataPipeline
from conformance.errors import InputError
from conformance.run.metrics import read_metrics, updates
from ref_torch.trainer import train as torch_train

BASE = {"model": {"name": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "bias": False},
        "data": {"name": "text", "corpus": "tinyshakespeare", "batch_size": 8},
        "optimizer": {"name": "adamw", "lr": 3e-3}, "checkpoint": {"every": 0, "at_end": True},
        "run": {"max_updates": 15, "eval_every": 0, "seed": 4}}


def cfg(**model: Any) -> dict[str, Any]:
    out = {k: dict(v) for k, v in BASE.items()}
    out["model"].update(model)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pretrained")
    result = torch_train(cfg(), root / "run", progress="none")
    assert main(["export", str(root / "run"), "--to", "hf", "-o", str(root / "hf")]) == 0
    torch.save({f"module.{k}": torch.from_numpy(v) for k, v in result.params.items()}, root / "ddp.pt")
    return {"root": root, "params": result.params, "checkpoint": result.checkpoint}


def first_window_loss(params: dict[str, np.ndarray]) -> float:
    """The mean token cross-entropy of `params` on update 0's window, computed here."""
    config = load_config(cfg())
    return mean_token_loss(config, params, ((b.x, b.y) for b in DataPipeline(config).window(0).batches))


def first_loss(trainer: Trainer, out: Path, **model: Any) -> float:  # noqa: F811
    config = cfg(**model)
    config["run"]["max_updates"] = 1
    _, records = trainer.run(config, out)
    return updates(records)[0]["loss"]


def test_a_run_starts_from_the_exported_model(trainer: Trainer, trained: dict, tmp_path: Path) -> None:  # noqa: F811
    want = first_window_loss(trained["params"])
    got = first_loss(trainer, tmp_path / "hf", init=str(trained["root"] / "hf"))
    assert got == pytest.approx(want, rel=1e-6)  # float32 forward passes: torch 0, JAX 6.5e-8 measured
    fresh = first_loss(trainer, tmp_path / "fresh")
    assert abs(fresh - math.log(65)) < 0.1 and abs(fresh - want) > 0.3  # control: the untrained model


def test_checkpoints_and_torch_files_load_the_same_weights(trainer: Trainer, trained: dict,  # noqa: F811
                                                           tmp_path: Path) -> None:
    losses = [first_loss(trainer, tmp_path / name, init=str(path)) for name, path in
              (("hf", trained["root"] / "hf"), ("ckpt", trained["checkpoint"]), ("pt", trained["root"] / "ddp.pt"))]
    assert losses[0] == losses[1] == losses[2]


def test_a_resume_does_not_read_the_file_again(trained: dict, tmp_path: Path) -> None:
    source = tmp_path / "weights"
    shutil.copytree(trained["root"] / "hf", source)
    whole = cfg(init=str(source))
    whole["run"]["max_updates"], whole["checkpoint"]["every"] = 4, 2
    torch_train(whole, tmp_path / "whole", progress="none")
    part = {**whole, "run": {**whole["run"], "max_updates": 2}}
    torch_train(part, tmp_path / "part", progress="none")
    shutil.rmtree(source)
    resumed = torch_train(whole, tmp_path / "part", progress="none", resume=True)
    want = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    assert [r["loss"] for r in updates(read_metrics(tmp_path / "part" / "metrics.jsonl"))] == \
        [r["loss"] for r in updates(want)]
    assert resumed.updates_done == 4
    with pytest.raises(InputError, match=r"^model.init: .*weights: no such file or directory"):
        torch_train(whole, tmp_path / "again", progress="none")


def test_a_mismatched_model_is_refused_naming_the_tensor(trained: dict, tmp_path: Path) -> None:
    shutil.copytree(trained["root"] / "hf", tmp_path / "hf")
    (tmp_path / "hf" / "config.json").unlink()  # the weights alone: their shapes are all there is
    with pytest.raises(InputError, match=r"^model.init: .*model.safetensors: weight 'transformer.wte.weight' has "
                                         r"shape \(65, 16\); the model needs \(65, 32\)"):
        torch_train(cfg(init=str(tmp_path / "hf"), n_embd=32), tmp_path / "run", progress="none")


@pytest.mark.parametrize("field, value, theirs, want", [("n_embd", 32, "n_embd", 16), ("n_head", 4, "n_head", 2),
                                                        ("block_size", 8, "n_positions", 16)])
def test_sizes_that_differ_from_the_config_json_are_refused_naming_both(trained: dict, tmp_path: Path, field: str,
                                                                        value: int, theirs: str, want: int) -> None:
    # n_head above all: the same weights split into other heads have every tensor's shape
    with pytest.raises(InputError, match=rf"^model.init: .*config.json has {theirs} = {want}, but model.{field} = "
                                         rf"{value}; set model.{field} = {want}$"):
        torch_train(cfg(init=str(trained["root"] / "hf"), **{field: value}), tmp_path / "run", progress="none")


def test_gpt2s_tanh_gelu_is_one_warning(trained: dict, tmp_path: Path) -> None:
    import json
    import warnings

    from conformance.errors import TwinstepWarning

    shutil.copytree(trained["root"] / "hf", tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:  # control: twinstep's export says "gelu"
        warnings.simplefilter("always")
        torch_train(cfg(init=str(tmp_path / "hf"), bias=True), tmp_path / "a", progress="none")
    assert not [w for w in caught if issubclass(w.category, TwinstepWarning)]
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**hf, "activation_function": "gelu_new"}))
    with pytest.warns(TwinstepWarning, match=r"activation_function = 'gelu_new'; the built-in gpt uses exact GELU"):
        torch_train(cfg(init=str(tmp_path / "hf"), bias=True), tmp_path / "b", progress="none")


def test_a_nonzero_bias_for_a_bias_free_model_is_refused(trained: dict, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    shutil.copytree(trained["root"] / "hf", tmp_path / "hf")
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    tensors["transformer.h.0.mlp.c_fc.bias"] = tensors["transformer.h.0.mlp.c_fc.bias"] + 1.0
    save_file(tensors, tmp_path / "hf" / "model.safetensors")
    with pytest.raises(InputError, match=r"'transformer.h.0.mlp.c_fc.bias' is a non-zero bias, but model.bias = "
                                         r"false"):
        torch_train(cfg(init=str(tmp_path / "hf")), tmp_path / "run", progress="none")


def test_paths_without_weights_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"^model.init: .*empty holds no model.safetensors or pytorch_model.bin$"):
        torch_train(cfg(init=str(tmp_path / "empty")), tmp_path / "a", progress="none")
    with pytest.raises(InputError, match=r"^model.init: .*nothing: no such file or directory$"):
        torch_train(cfg(init=str(tmp_path / "nothing")), tmp_path / "b", progress="none")


def test_a_gpt2_that_transformers_wrote_starts_the_run_at_its_own_loss(tmp_path: Path) -> None:
    # expected value from transformers itself: a tiny randomly initialised GPT2LMHeadModel (exact GELU,
    # as the built-in gpt) saved with save_pretrained, its loss on update 0's window computed by it
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=65, n_positions=16, n_embd=16, n_layer=1, n_head=2, activation_function="gelu",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(len(name)))  # non-zero biases
    hf.save_pretrained(tmp_path / "gpt2")
    pipe = DataPipeline(load_config(cfg()))
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in pipe.window(0).batches:
            logits = hf(torch.from_numpy(batch.x)).logits
            total += float(F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch.y).flatten(), reduction="sum"))
            count += batch.y.size
    config = cfg(init=str(tmp_path / "gpt2"), bias=True)
    config["run"]["max_updates"] = 1
    torch_train(config, tmp_path / "run", progress="none")
    got = updates(read_metrics(tmp_path / "run" / "metrics.jsonl"))[0]["loss"]
    assert got == pytest.approx(total / count, rel=1e-6)  # float32, transformers' Conv1D vs nn.Linear
