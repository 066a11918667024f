"""`twinstep train` end to end: the bundled configs reach their targets, metrics lines carry the
docs/contract.md §5 keys, the resolved config reproduces the run, and bad input is one line, exit 2,
with nothing already saved lost (a tampered checkpoint, an occupied output directory, a bad --set)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from conformance import checkpoint as ck
from conformance.cli import main
from conformance.config import dump_config, load_config
from conformance.run.metrics import EVAL_KEYS, UPDATE_KEYS, evals, read_metrics, updates

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on 2 shared cores: threads only contend
    yield
    torch.set_num_threads(before)


def train(*args: str) -> int:
    return main(["train", *args, "--progress", "none"])


def final_params(out: Path) -> dict[str, np.ndarray]:
    return ck.load_checkpoint(ck.find_latest(out / "checkpoints")).state.model


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_linear_regression_config_learns_weight_3_bias_2(tmp_path: Path) -> None:
    assert train(str(CONFIGS / "linear_regression.toml"), "--out", str(tmp_path / "lr")) == 0
    p = final_params(tmp_path / "lr")
    assert abs(float(p["weight"][0, 0]) - 3.0) <= 0.01
    assert abs(float(p["bias"][0]) - 2.0) <= 0.01
    assert len(updates(read_metrics(tmp_path / "lr" / "metrics.jsonl"))) == 80  # 20 epochs × 4


def test_digits_mlp_config_reaches_95_percent(tmp_path: Path) -> None:
    assert train(str(CONFIGS / "digits_mlp.toml"), "--out", str(tmp_path / "dg")) == 0
    last = evals(read_metrics(tmp_path / "dg" / "metrics.jsonl"))[-1]
    assert last["update"] == 899
    assert last["val_accuracy"] >= 0.95


def test_default_config_every_line_has_the_contract_keys(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "default"
    assert main(["train", "--out", str(out), "--progress", "lines"]) == 0
    err = capsys.readouterr().err
    assert "update 320/320" in err and "eval at update 319 (320/320 done)" in err and "trained 320 updates" in err
    records = read_metrics(out / "metrics.jsonl")
    ups, evs = updates(records), evals(records)
    # every evaluation is named on the console by the number metrics.jsonl gives it
    assert [int(u) for u in re.findall(r"^eval at update (\d+) ", err, re.MULTILINE)] == [r["update"] for r in evs]
    assert [r["update"] for r in ups] == list(range(320))
    for r in ups:
        assert set(UPDATE_KEYS) <= set(r), sorted(set(UPDATE_KEYS) - set(r))
        assert isinstance(r["loss"], float) and math.isfinite(r["loss"])
        assert isinstance(r["lr"], list) and len(r["lr"]) == 1
        assert r["loss_scale"] is None and r["skipped"] is False
        assert r["grad_norm"] > 0 and r["samples_per_s"] > 0 and r["peak_memory_bytes"] > 0
    assert [r["update"] for r in evs] == [99, 199, 299, 319]
    for r in evs:
        assert set(EVAL_KEYS) <= set(r) and 0.0 <= r["val_accuracy"] <= 1.0
    assert evs[-1]["val_accuracy"] > 0.9
    assert load_config(out / "config.toml") == load_config(None)  # resolved: every default written out


def test_resolved_config_reproduces_the_run(tmp_path: Path) -> None:
    config = CONFIGS / "linear_regression.toml"
    assert train(str(config), "--out", str(tmp_path / "a"), "--set", "run.epochs=3") == 0
    resolved = tmp_path / "a" / "config.toml"
    assert "epochs = 3" in resolved.read_text()
    assert train(str(resolved), "--out", str(tmp_path / "b")) == 0
    a, b = final_params(tmp_path / "a"), final_params(tmp_path / "b")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert dump_config(load_config(resolved)) == resolved.read_text()


def _one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("twinstep: error: "), err
    assert "Traceback" not in err[0]
    return err[0]


def test_tampered_checkpoint_is_refused_and_nothing_is_lost(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    args = [str(CONFIGS / "linear_regression.toml"), "--out", str(out), "--set", "checkpoint.every=20"]
    assert train(*args) == 0
    newest = ck.list_checkpoints(out / "checkpoints")[0][1]
    target = newest / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the last weight
    target.chmod(0o600)
    target.write_bytes(bytes(data))
    capsys.readouterr()
    before = tree_digest(out)
    assert train(*args, "--resume") == 2
    line = _one_line_error(capsys)
    assert "model.safetensors" in line and "sha256" in line
    older = ck.list_checkpoints(out / "checkpoints")[1][1].name  # what to do about it, in the same line
    assert f"the older checkpoint {older} verifies" in line and "--set checkpoint.allow_fallback=true" in line
    assert tree_digest(out) == before  # nothing rewritten, nothing deleted
    # the previous complete checkpoint stands in only when asked for, with a one-line warning
    assert train(*args, "--resume", "--set", "checkpoint.allow_fallback=true") == 0
    err = capsys.readouterr().err.splitlines()
    warned = [e for e in err if "skipping checkpoint" in e]
    assert len(warned) == 1 and warned[0].startswith("twinstep: warning: skipping checkpoint ")
    assert "step-00000080" in warned[0] and not any("UserWarning" in e or "warnings.warn" in e for e in err)


def test_output_directory_with_checkpoints_needs_resume(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    args = [str(CONFIGS / "linear_regression.toml"), "--out", str(out), "--set", "run.epochs=2"]
    assert train(*args) == 0
    before = tree_digest(out)
    capsys.readouterr()
    assert train(*args) == 2
    assert "--resume" in _one_line_error(capsys)
    assert tree_digest(out) == before


def test_resume_refuses_a_changed_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    args = [str(CONFIGS / "linear_regression.toml"), "--out", str(out), "--set", "run.epochs=2"]
    assert train(*args) == 0
    capsys.readouterr()
    assert train(*args, "--resume", "--set", "optimizer.lr=0.1") == 2
    assert "optimizer.lr was 0.2 in the checkpoint and is 0.1 now" in _one_line_error(capsys)
    # a longer run is a resumable change: it continues from update 8
    assert train(str(CONFIGS / "linear_regression.toml"), "--out", str(out), "--set", "run.epochs=3", "--resume") == 0
    assert [r["update"] for r in updates(read_metrics(out / "metrics.jsonl"))] == list(range(12))


@pytest.mark.parametrize(("override", "field"), [("optimizer.betas=[0.9, 1.5]", "optimizer.betas[1]"),
                                                 ("run.device=\"tpu\"", "run.device"),
                                                 ("loss.name=\"mse\"", "loss.name")])
def test_bad_config_is_one_line_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture, override: str,
                                                 field: str) -> None:
    assert train("--out", str(tmp_path / "x"), "--set", override) == 2
    assert field in _one_line_error(capsys)


def test_plot_metrics_writes_a_figure(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert train(str(CONFIGS / "linear_regression.toml"), "--out", str(out), "--set", "run.epochs=2") == 0
    png = tmp_path / "curves.png"
    assert main(["plot", "metrics", str(out), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["plot", "metrics", str(tmp_path / "missing"), "-o", str(png)]) == 2
    assert "no such metrics file" in _one_line_error(capsys)


def test_metrics_lines_are_strict_json(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert train(str(CONFIGS / "linear_regression.toml"), "--out", str(out), "--set", "run.epochs=1",
                 "--set", "run.inject_nonfinite=[1]", "--set", "precision.loss_scale=\"dynamic\"") == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    for line in lines:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    skipped = updates(read_metrics(out / "metrics.jsonl"))[1]
    assert skipped["skipped"] and skipped["loss"] == math.inf and skipped["grad_norm"] is None


@pytest.mark.parametrize("argv, words", [
    (["train", "--backend", "foo", "--out", "x"],
     "twinstep train: error: argument --backend: invalid choice: 'foo' (choose from 'torch', 'jax')"),
    (["train", "--out", "x", "--nope"], "twinstep: error: unrecognized arguments: --nope"),
    (["checkpoint", "nope", "x"], "twinstep checkpoint: error: argument action: invalid choice: 'nope'"),
])
def test_a_usage_error_is_one_line_with_its_choices(argv: list, words: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and err.count("\n") == 1 and "usage:" not in err

