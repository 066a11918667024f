"""`twinstep port`: code to stdout or a file, --check, --to spec, weights; one-line errors, exit 2."""

from __future__ import annotations

import tomllib

import numpy as np
import pytest
import torch

from conformance.checkpoint.files import load_tensors
from conformance.cli import main
from conformance.config import load_config
from ref_torch import models as tmodels

CONFIG = """
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
dampening = 0.5
[[optimizer.groups]]
params = ["*.bias"]
lr = 0.01
[schedule]
name = "cosine"
t_max = 5
[clip]
max_norm = 1.0
[accumulation]
steps = 2
normalize = "tokens"
[model]
name = "mlp"
in_features = 3
out_features = 2
hidden = [4]
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    return path


@pytest.mark.parametrize("to", ["torch", "optax"])
def test_code_goes_to_stdout_or_a_file(to: str, config, tmp_path, capsys) -> None:
    assert main(["port", str(config), "--to", to]) == 0
    code = capsys.readouterr().out
    compile(code, "snippet", "exec")
    assert "twinstep spec from run.toml" in code and ("torch_momentum" in code if to == "optax" else True)
    out = tmp_path / f"{to}.py"
    assert main(["port", str(config), "--to", to, "-o", str(out)]) == 0
    assert out.read_text() == code


@pytest.mark.parametrize("to", ["torch", "optax"])
def test_check_runs_the_snippet_against_the_backend(to: str, config, capsys) -> None:
    assert main(["port", str(config), "--to", to, "--check"]) == 0
    err = capsys.readouterr().err
    assert "twinstep: checked:" in err and "over 8 updates" in err


@pytest.mark.parametrize("to", ["torch", "optax"])
def test_check_uses_the_names_the_groups_give(to: str, tmp_path, capsys) -> None:
    """Groups that name the user's own model ('fc.weight', 'encoder.*', a class): --check runs on a
    parameter for each pattern (and two the default group keeps), not on the built-in model's names."""
    from conformance.port.verify.traces import check_shapes

    path = tmp_path / "mine.toml"
    path.write_text('[optimizer]\nname = "adamw"\nlr = 0.01\nno_weight_decay = ["*norm[12].weight"]\n'
                    '[[optimizer.groups]]\nparams = ["fc.weight", "encoder.*"]\nlr = 0.001\n')
    assert main(["port", str(path), "--to", to, "--check"]) == 0
    assert "max |difference|" in capsys.readouterr().err
    names = set(check_shapes(load_config(path)))
    assert names == {"fc.weight", "encoder.w", "wnorm1.weight", "rest_0.weight", "rest_0.bias"}
    assert set(check_shapes(load_config({}))) == {"0.weight", "0.bias", "2.weight", "2.bias", "3.weight", "3.bias"}


def test_to_spec_resolves_a_config_and_translates_an_optax_description(config, tmp_path, capsys) -> None:
    assert main(["port", str(config), "--to", "spec", "--set", "optimizer.lr=0.2"]) == 0
    resolved = tomllib.loads(capsys.readouterr().out)
    assert resolved["optimizer"]["lr"] == 0.2 and resolved["precision"]["dtype"] == "float32"
    described = tmp_path / "optax.toml"
    described.write_text('[optax]\nadamw = {learning_rate = 1e-3}\n')
    assert main(["port", str(described), "--to", "spec"]) == 0
    spec = tomllib.loads(capsys.readouterr().out)
    assert spec["optimizer"]["weight_decay"] == 1e-4 and set(spec) == {"optimizer", "schedule"}
    assert main(["port", str(described), "--to", "torch"]) == 0  # an optax description straight to torch code
    assert "torch.optim.AdamW" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["port", "{config}"], "port CONFIG needs --to torch, --to optax, --to spec or --to hf"),
    (["port", "{tmp}/missing.toml", "--to", "torch"], "missing.toml: no such file"),
    (["port", "{optax}", "--to", "spec"], "optax.radam cannot be translated"),
    (["port", "weights", "{tmp}/w.pt"], "port weights needs --config CONFIG"),
    (["port", "weights", "{tmp}/w.pt", "--config", "{config}", "-o", "{tmp}/o.safetensors"], "w.pt: cannot read"),
])
def test_errors_are_one_line_without_a_traceback(argv: list[str], words: str, config, tmp_path, capsys) -> None:
    optax = tmp_path / "radam.toml"
    optax.write_text("[optax]\nradam = {learning_rate = 0.1}\n")
    args = [a.format(config=config, tmp=tmp_path, optax=optax) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinstep: error: ") and words in err and err.count("\n") == 1, err


def test_weights_command_writes_what_the_model_loads(config, tmp_path, capsys) -> None:
    spec = load_config(config).model
    model = tmodels.build_model(spec, None, seed=3, dtype="float32")
    src = tmp_path / "w.pt"
    torch.save(model.state_dict(), src)
    out = tmp_path / "neutral.safetensors"
    assert main(["port", "weights", str(src), "--config", str(config), "-o", str(out)]) == 0
    assert "wrote 6 tensors" in capsys.readouterr().err
    fresh = tmodels.build_model(spec, None, seed=9, dtype="float32")
    from ref_torch.checkpoint import import_weights, model_state

    import_weights(fresh, out)
    for k, v in model_state(model).items():
        np.testing.assert_array_equal(model_state(fresh)[k], v)
    assert set(load_tensors(out)) == set(model_state(model))
