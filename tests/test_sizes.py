"""Every size a config can name is checked arithmetically before anything is allocated: the built-in
models' parameter count in closed form (equal to the sum of the shapes the models are built from),
and synthetic data (`data.n_samples`) by samples × values × 8 bytes, each refused against the
machine's memory as one line naming the field, exit 2, on both trainers, with no run directory."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.trainers import FRAMEWORKS

from conformance.cli import main
from conformance.config import load_config
from conformance.errors import ConfigError
from conformance.run import preflight
from conformance.rules.models import param_count, param_shapes

ROOT = Path(__file__).resolve().parents[1]

SPECS = [
    ['model.name="linear"', "model.in_features=3", "model.out_features=2"],
    ['model.name="linear"', "model.in_features=3", "model.out_features=2", "model.bias=false"],
    ["model.in_features=20", "model.out_features=2", "model.hidden=[7, 5, 3]", 'model.norm="layernorm"'],
    ["model.in_features=20", "model.out_features=2", "model.hidden=[7]", "model.bias=false", 'model.norm="layernorm"'],
    ['model.name="gpt"', "model.vocab_size=11", "model.block_size=9", "model.n_layer=3", "model.n_head=2",
     "model.n_embd=8"],
    ['model.name="gpt"', "model.vocab_size=11", "model.block_size=9", "model.n_layer=2", "model.n_head=2",
     "model.n_embd=6", "model.bias=false"],
]


@pytest.mark.parametrize("sets", SPECS, ids=lambda s: " ".join(s))
@pytest.mark.parametrize("non_embedding", [False, True])
def test_the_closed_form_count_equals_the_shapes(sets: list[str], non_embedding: bool) -> None:
    spec = load_config(overrides=sets).model
    shapes = param_shapes(spec, None)  # the enumeration the models are built from: the independent count
    if non_embedding:
        shapes.pop("transformer.wpe.weight", None)
    assert param_count(spec, None, non_embedding) == sum(math.prod(s) for s in shapes.values())


def train(capsys: pytest.CaptureFixture, tmp_path: Path, framework: str, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["train", *args, "--backend", framework, "--out", str(tmp_path / "run"), "--progress", "none"])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("args, message", [
    (("--set", "data.n_samples=1000000000000"),
     "data.n_samples = 1000000000000 makes 156462.2 GiB of binary_blobs samples"),
    ((str(ROOT / "configs" / "gpt_tiny.toml"), "--set", "model.n_layer=1000000000"),
     "model (model.n_layer = 1000000000, model.n_embd = 64, model.block_size = 64): 49984000010816 parameters need"),
], ids=["blobs-1e12", "gpt-1e9-layers"])
def test_a_size_the_machine_cannot_hold_is_one_line(capsys: pytest.CaptureFixture, tmp_path: Path, framework: str,
                                                    args: tuple[str, ...], message: str) -> None:
    code, err = train(capsys, tmp_path, framework, *args)
    assert code == 2 and len(err) == 1 and err[0].startswith("twinstep: error: ") and message in err[0]
    assert "GiB" in err[0] and "this machine has" in err[0]
    assert not (tmp_path / "run").exists()


def test_negative_control_sizes_that_fit_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(overrides=["data.n_samples=1000000"])  # 168 MB of samples
    preflight.check_data_size(config)
    monkeypatch.setattr(preflight, "_memory_bytes", lambda: 1000000 * 21 * 8 - 1)  # one byte short
    with pytest.raises(ConfigError, match=r"^data.n_samples = 1000000 makes 0.2 GiB"):
        preflight.check_data_size(config)
