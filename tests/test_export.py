"""`twinstep export` (docs/export.md): trained runs' checkpoints as a Hugging Face
GPT-2 (transformers' logits = twinstep's forward in float64, 1e-6, on torch- and JAX-trained runs),
a torch state_dict and ref_jax's NNX tree (exact round trips for every bundled model), the EMA
weights, the vocabulary as a tokenizer, and the refusals (one line, exit 2, nothing written).
Negative controls: a Conv1D weight left untransposed, an untied head, the tanh GELU are caught by
the same logits check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from support.trainers import Trainer

from conformance.checkpoint import load_checkpoint
from conformance.cli import main
from conformance.config import load_config
from conformance.config.model import ModelSpec
from conformance.export import export
from conformance.export.vocab import byte_vocabulary, tokenizer_files

ROOT = Path(__file__).resolve().parents[1]
GPT = """
[model]
name = "gpt"
n_layer = 2
n_head = 2
n_embd = 16
block_size = 8
bias = {bias}
dropout = {dropout}
init_std = 0.5  # pre-activations of order 1, where the GELU forms differ by ~1e-3 (0.02: < 1e-6)
[data]
name = "text"
path = "{corpus}"
batch_size = 4
[optimizer]
name = "adamw"
lr = 1e-2
[ema]
decay = 0.8
[run]
max_updates = 4
eval_every = 0
device = "cpu"
"""
SMALL = {
    "linear": '[model]\nname = "linear"\n[data]\nname = "linear_regression"\nbatch_size = 16\n[loss]\nname = "mse"\n',
    "mlp": '[model]\nname = "mlp"\nhidden = [8, 6]\n[data]\nname = "digits"\nbatch_size = 32\n',
}
RUN = '[optimizer]\nname = "sgd"\nlr = 0.1\n[run]\nmax_updates = 3\neval_every = 0\ndevice = "cpu"\n'
RUNS = {"gpt[torch]": ("torch", "true", 0.0), "gpt[jax]": ("jax", "true", 0.0), "gpt-nobias[torch]": ("torch", "false", 0.1)}
FRAMEWORK_PROBE = """
import sys
{before}
from conformance.export import export
export({run!r}, "torch", {out!r})
print(" ".join(sorted({{m.split(".")[0] for m in sys.modules}} & {{"torch", "jax", "flax", "transformers"}})))
"""


def _train(backend: str, text: str, out: Path) -> Path:
    import importlib

    path = out.with_suffix(".toml")
    path.write_text(text)
    Trainer(backend, importlib.import_module(f"ref_{backend}.trainer")).train(load_config(path), out)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, one_thread) -> dict[str, Path]:
    """Trained runs: three tiny gpts (torch, JAX, torch without biases and with dropout), linear, mlp."""
    root = tmp_path_factory.mktemp("export")
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "é", "\n"]
    (root / "corpus.txt").write_text(" ".join(rng.choice(words, 3000)))
    out = {}
    for name, (backend, bias, dropout) in RUNS.items():
        text = GPT.format(bias=bias, dropout=dropout, corpus=root / "corpus.txt")
        out[name] = _train(backend, text, root / name.replace("[", "-").rstrip("]"))
    for name, text in SMALL.items():
        out[name] = _train("torch", text + RUN, root / name)
    return out


def _checkpoint(run: Path):
    return load_checkpoint(sorted((run / "checkpoints").glob("step-*"))[-1])


def _tokens(spec: ModelSpec) -> np.ndarray:
    return np.random.default_rng(1).integers(0, spec.vocab_size, (3, spec.block_size))


def _twinstep_logits(backend: str, spec: ModelSpec, weights: dict, x: np.ndarray) -> np.ndarray:
    if backend == "jax":
        from ref_jax.backend import context
        from ref_jax.models import forward

        with context():
            return forward(spec, weights, x, "float64")
    from ref_torch.models import forward

    return forward(spec, weights, x, "float64")


def _hf_logits(directory: Path, x: np.ndarray) -> np.ndarray:
    import torch
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float64).eval()
    with torch.no_grad():
        return model(torch.from_numpy(x)).logits.numpy()


def _hf_error(directory: Path, backend: str, weights: dict) -> float:
    """The largest |HF − twinstep| logit, relative to the largest logit (at least 1)."""
    spec = ModelSpec(**json.loads((directory / "twinstep.json").read_text())["model"])
    x = _tokens(spec)
    want = _twinstep_logits(backend, spec, weights, x)
    return float(np.abs(_hf_logits(directory, x) - want).max() / max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("name", list(RUNS))
def test_hf_logits_equal_twinstep_forward(runs: dict[str, Path], name: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    export(runs[name], "hf", tmp_path / "hf")
    err = _hf_error(tmp_path / "hf", RUNS[name][0], _checkpoint(runs[name]).state.model)
    assert err <= 1e-6, err
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["activation_function"] == "gelu" and config["tie_word_embeddings"] is True
    assert config["layer_norm_epsilon"] == 1e-5 and config["n_positions"] == 8  # eps 1e-6 would pass the logits
    assert config["twinstep_vocabulary"]["kind"] == "chars"


def _mutate(directory: Path, how: str) -> None:
    weights, config = directory / "model.safetensors", directory / "config.json"
    if how == "untransposed-conv1d":
        t = safetensors.numpy.load_file(weights)
        t["transformer.h.0.attn.c_proj.weight"] = np.ascontiguousarray(t["transformer.h.0.attn.c_proj.weight"].T)
        safetensors.numpy.save_file(t, weights, metadata={"format": "pt"})
        return
    c = json.loads(config.read_text())
    c.update({"untied-head": {"tie_word_embeddings": False}, "gelu-tanh": {"activation_function": "gelu_new"}}[how])
    config.write_text(json.dumps(c))


@pytest.mark.parametrize("how", ["untransposed-conv1d", "untied-head", "gelu-tanh"])
def test_negative_control_the_logits_check_catches(runs: dict[str, Path], how: str, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    export(runs["gpt[torch]"], "hf", tmp_path / "hf")
    _mutate(tmp_path / "hf", how)
    assert _hf_error(tmp_path / "hf", "torch", _checkpoint(runs["gpt[torch]"]).state.model) > 1e-5


def test_hf_tokenizer_is_the_runs_vocabulary(runs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from conformance.data.datasets import load_dataset

    export(runs["gpt[jax]"], "hf", tmp_path / "hf")
    config = load_config(runs["gpt[jax]"] / "config.toml")
    vocab = load_dataset(config.data, config.run.seed, 8).info.vocab
    text = "the cat é\nsat"
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tok(text)["input_ids"]
    assert ids == [vocab.index(c) for c in text]
    assert tok.decode(ids) == text


def test_byte_tokenizer_is_the_utf8_bytes(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_files(byte_vocabulary(), 8)["tokenizer.json"].decode())
    text = "a é €\n\tz"
    assert tok.encode(text).ids == list(text.encode("utf-8"))
    assert tok.decode(list(text.encode("utf-8"))) == text


@pytest.mark.parametrize("name", ["linear", "mlp", "gpt[torch]", "gpt-nobias[torch]"])
def test_torch_round_trip_is_exact(runs: dict[str, Path], name: str, tmp_path: Path) -> None:
    import safetensors.torch

    from ref_torch.models import build_model, named_parameters

    export(runs[name], "torch", tmp_path / "pt")
    spec = ModelSpec(**json.loads((tmp_path / "pt" / "twinstep.json").read_text())["model"])
    weights = _checkpoint(runs[name]).state.model
    model = build_model(spec, None, dtype="float32")
    model.load_state_dict(safetensors.torch.load_file(tmp_path / "pt" / "model.safetensors"))  # strict
    got = {k: v.detach().numpy() for k, v in named_parameters(model).items()}
    assert sorted(got) == sorted(weights) and all(np.array_equal(got[k], weights[k]) for k in weights)
    if spec.name == "gpt":
        assert model.lm_head.weight is model.transformer.wte.weight  # still tied after the load


@pytest.mark.parametrize("name", ["linear", "mlp", "gpt[jax]", "gpt-nobias[torch]"])
def test_flax_round_trip_is_exact(runs: dict[str, Path], name: str, tmp_path: Path) -> None:
    from flax import nnx
    from flax.traverse_util import unflatten_dict

    from ref_jax.models import build_model, named_parameters

    export(runs[name], "flax", tmp_path / "fx")
    spec = ModelSpec(**json.loads((tmp_path / "fx" / "twinstep.json").read_text())["model"])
    weights = _checkpoint(runs[name]).state.model
    model = build_model(spec, None, dtype="float32")
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, unflatten_dict(safetensors.numpy.load_file(tmp_path / "fx" / "flax_model.safetensors"),
                                                   sep="/"))
    nnx.update(model, state)
    got = {k: np.asarray(v) for k, v in named_parameters(model).items()}
    assert sorted(got) == sorted(weights) and all(np.array_equal(got[k], weights[k]) for k in weights)


def test_ema_exports_the_ema_weights(runs: dict[str, Path], tmp_path: Path) -> None:
    from conformance.checkpoint.ema import ema_weights

    step = sorted((runs["gpt[torch]"] / "checkpoints").glob("step-*"))[-1]
    export(None, "torch", tmp_path / "ema", checkpoint=step, ema=True)
    got = safetensors.numpy.load_file(tmp_path / "ema" / "model.safetensors")
    want, model = ema_weights(step), _checkpoint(runs["gpt[torch]"]).state.model
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert not all(np.array_equal(want[k], model[k]) for k in want)  # the EMA is not the model
    assert json.loads((tmp_path / "ema" / "twinstep.json").read_text())["weights"] == "ema"


def _cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = main(["export", *args])
    err = capsys.readouterr().err
    return code, err


def test_refusals_are_one_line_and_write_nothing(runs: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    cases = {
        "no EMA": ([str(runs["mlp"]), "--to", "torch", "-o", str(out), "--ema"], "holds no EMA weights"),
        "hf for an mlp": ([str(runs["mlp"]), "--to", "hf", "-o", str(out)], "only the bundled gpt"),
        "no checkpoint": ([str(tmp_path), "--to", "torch", "-o", str(out)], "no checkpoint to export"),
        "no run": ([str(tmp_path / "nowhere"), "--to", "torch", "-o", str(out)], "no such run directory"),
        "tokenizer on text": ([str(runs["gpt[torch]"]), "--to", "hf", "-o", str(out), "--tokenizer", "bytes"],
                              "--tokenizer is for runs on token shards"),
    }
    for what, (args, message) in cases.items():
        code, err = _cli(args, capsys)
        assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, (what, err)
        assert not out.exists(), what
    for inside in (runs["mlp"], runs["mlp"] / "checkpoints" / "step-00000003" / "x"):  # --force must not delete the run
        code, err = _cli([str(runs["mlp"]), "--to", "torch", "-o", str(inside), "--force"], capsys)
        assert code == 2 and "overlaps the checkpoint" in err, err
    assert not (runs["mlp"] / "checkpoints" / "step-00000003" / "x").exists()
    assert _checkpoint(runs["mlp"]).state.update == 3  # still there and still verifies
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = _cli([str(runs["mlp"]), "--to", "torch", "-o", str(out)], capsys)
    assert code == 2 and "not empty" in err and (out / "keep.txt").read_text() == "mine"
    code, err = _cli([str(runs["mlp"]), "--to", "torch", "-o", str(out), "--force"], capsys)
    assert code == 0 and not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp directory left


def test_a_tampered_checkpoint_is_refused(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import shutil

    step = tmp_path / "step-00000003"
    shutil.copytree(sorted((runs["mlp"] / "checkpoints").glob("step-*"))[-1], step)
    data = bytearray((step / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (step / "model.safetensors").write_bytes(bytes(data))
    code, err = _cli(["--checkpoint", str(step), "--to", "flax", "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and "model.safetensors" in err and "sha256" in err and not (tmp_path / "out").exists()


def test_a_failed_write_leaves_the_old_export(runs: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    from conformance.errors import PathError
    from conformance.export import write

    out = tmp_path / "out"
    export(runs["linear"], "torch", out)
    before = (out / "model.safetensors").read_bytes()

    def full(path: Path, data: bytes, mode: int = 0o600) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(write, "create_durable", full)
    with pytest.raises(PathError, match="No space left on device"):
        export(runs["mlp"], "torch", out, force=True)
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _frameworks_loaded(run: Path, out: Path, before: str = "") -> str:
    code = FRAMEWORK_PROBE.format(before=before, run=str(run), out=str(out))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.stdout.strip()


def test_export_loads_no_framework(runs: dict[str, Path], tmp_path: Path) -> None:
    assert _frameworks_loaded(runs["gpt[torch]"], tmp_path / "a") == ""
    assert _frameworks_loaded(runs["gpt[torch]"], tmp_path / "b", "import torch") == "torch"  # the probe sees it


def test_token_shard_run_records_the_named_tokenizer(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture, one_thread) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from conformance.data.tokenize import tokenize

    (tmp_path / "a.txt").write_text("the cat sat on a mat é\n" * 40)
    tokenize([str(tmp_path / "a.txt")], tmp_path / "shards", "bytes", progress=False)
    text = GPT.format(bias="true", dropout=0.0, corpus="-").replace('name = "text"\npath = "-"', (
        f'name = "tokens"\npath = "{tmp_path}/shards/train_*.bin"')).replace("n_embd = 16", "n_embd = 16\nvocab_size = 256")
    run = _train("torch", text, tmp_path / "run")
    beside = tmp_path / "shards" / "tokenizer.json"  # written by data tokenize
    code, err = _cli([str(run), "--to", "hf", "-o", str(tmp_path / "found")], capsys)
    assert code == 0 and "warning" not in err and "vocabulary: tokenizer.json" in err
    assert (tmp_path / "found" / "tokenizer.json").read_bytes() == beside.read_bytes()
    assert AutoTokenizer.from_pretrained(tmp_path / "found")("cat é")["input_ids"] == list("cat é".encode())
    kept = beside.read_bytes()
    beside.unlink()  # control: nothing beside the shards, nothing recorded
    code, err = _cli([str(run), "--to", "hf", "-o", str(tmp_path / "plain")], capsys)
    assert code == 0 and "warning: the vocabulary is not recorded: no tokenizer.json beside" in err
    assert "--tokenizer bytes" in err and not (tmp_path / "plain" / "tokenizer.json").exists()
    beside.write_bytes(kept)
    shard = tmp_path / "shards" / "train_000000.bin"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # control: other shards beside the tokenizer (another token), so not the run's
    shard.write_bytes(bytes(data))
    code, err = _cli([str(run), "--to", "hf", "-o", str(tmp_path / "other")], capsys)
    assert code == 0 and "are not the ones the run trained on" in err and not (tmp_path / "other" / "tokenizer.json").exists()
    code, err = _cli([str(run), "--to", "hf", "-o", str(tmp_path / "hf"), "--tokenizer", "bytes"], capsys)
    assert code == 0 and "vocabulary: bytes" in err
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok("cat é")["input_ids"] == list("cat é".encode())
    assert _hf_error(tmp_path / "hf", "torch", _checkpoint(run).state.model) <= 1e-6
    (tmp_path / "tokenizer.json").write_bytes(tokenizer_files(byte_vocabulary(), 8)["tokenizer.json"] + b"\n\n")
    code, err = _cli([str(run), "--to", "torch", "-o", str(tmp_path / "pt"), "--tokenizer",
                      str(tmp_path / "tokenizer.json")], capsys)
    assert code == 0 and (tmp_path / "pt" / "tokenizer.json").read_bytes() == (tmp_path / "tokenizer.json").read_bytes()
    code, err = _cli([str(run), "--to", "torch", "-o", str(tmp_path / "bad"), "--tokenizer", str(tmp_path / "a.txt")],
                     capsys)
    assert code == 2 and "is not a Hugging Face tokenizer.json" in err and not (tmp_path / "bad").exists()


def test_a_refused_newest_checkpoint_names_the_older_one(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          one_thread) -> None:
    text = SMALL["linear"] + RUN + "[checkpoint]\nevery = 1\nkeep_last = 5\n"
    run = _train("torch", text, tmp_path / "run")
    newest = sorted((run / "checkpoints").glob("step-*"))[-1]
    (newest / "state.json").write_bytes((newest / "state.json").read_bytes() + b" ")
    code, err = _cli([str(run), "--to", "torch", "-o", str(tmp_path / "out")], capsys)
    older = run / "checkpoints" / "step-00000002"
    assert code == 2 and "state.json" in err and f"export it with --checkpoint {older}" in err, err
    code, _ = _cli(["--checkpoint", str(older), "--to", "torch", "-o", str(tmp_path / "out")], capsys)
    assert code == 0


def test_a_tampered_ema_is_refused(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """ema.safetensors is listed and hashed in the manifest like every checkpoint file."""
    import shutil

    step = tmp_path / "step-00000004"
    shutil.copytree(sorted((runs["gpt[torch]"] / "checkpoints").glob("step-*"))[-1], step)
    assert "ema.safetensors" in json.loads((step / "manifest.json").read_text())["files"]
    data = bytearray((step / "ema.safetensors").read_bytes())
    data[-1] ^= 1
    (step / "ema.safetensors").write_bytes(bytes(data))
    code, err = _cli(["--checkpoint", str(step), "--to", "hf", "-o", str(tmp_path / "out"), "--ema"], capsys)
    assert code == 2 and "ema.safetensors" in err and "sha256" in err


def test_a_changed_corpus_records_no_vocabulary(tmp_path: Path, capsys: pytest.CaptureFixture, one_thread) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcab cab\n" * 100)
    run = _train("torch", GPT.format(bias="true", dropout=0.0, corpus=corpus), tmp_path / "run")
    corpus.write_text("abcab cab\n" * 99 + "bacab cab\n")  # same characters, other text: ids may differ
    code, err = _cli([str(run), "--to", "hf", "-o", str(tmp_path / "changed")], capsys)
    assert code == 0 and "is not the one the run trained on" in err
    assert json.loads((tmp_path / "changed" / "config.json").read_text())["twinstep_vocabulary"] is None
    corpus.unlink()
    code, err = _cli([str(run), "--to", "hf", "-o", str(tmp_path / "gone")], capsys)
    assert code == 0 and "the run's corpus cannot be read" in err and not (tmp_path / "gone" / "tokenizer.json").exists()
