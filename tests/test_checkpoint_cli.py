"""Actionable messages: `twinstep checkpoint verify|list RUN_DIR` reports every checkpoint's
status without training or changing anything; warnings are one line; the harness says that an error
case's backend returned normally instead of crashing on it."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import pytest
from support.tamper import edit_state

from conformance import checkpoint as ck
from conformance.cli import main, show_warning
from conformance.errors import TwinstepWarning
from conformance.harness.backends import Backend
from conformance.harness.case import load_case
from conformance.harness.runner import run_case


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckcli") / "run"
    assert main(["train", "--out", str(out), "--set", "run.max_updates=6", "--set", "checkpoint.every=2",
                 "--set", "checkpoint.keep_last=5", "--progress", "none"]) == 0
    return out


def digest(path: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["checkpoint", *args])
    return code, capsys.readouterr().out.strip().splitlines()


def test_verify_and_list_a_healthy_run(run: Path, capsys: pytest.CaptureFixture) -> None:
    before = digest(run)
    code, lines = cli(capsys, "verify", str(run))
    assert code == 0 and len(lines) == 3 and all(": verified" in line for line in lines)
    assert lines[0].startswith(str(run / "checkpoints" / ck.step_name(6))) and "--resume continues from it" in lines[0]
    code, lines = cli(capsys, "list", str(run / "checkpoints"))
    assert code == 0 and lines[0].split() == ["checkpoint", "update", "size", "age", "val_loss", "status"]
    assert [line.split()[:2] for line in lines[1:]] == [[ck.step_name(u), str(u)] for u in (6, 4, 2)]
    assert all("verified" in line for line in lines[1:])
    code, lines = cli(capsys, "verify", str(run / "checkpoints" / ck.step_name(4)))
    assert code == 0 and lines == [f"{run / 'checkpoints' / ck.step_name(4)}: verified (--resume continues from it)"]
    assert digest(run) == before  # nothing trained, nothing changed


def test_verify_names_what_is_refused_and_what_to_do(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run, out)
    newest = out / "checkpoints" / ck.step_name(6)
    data = bytearray((newest / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (newest / "model.safetensors").chmod(0o600)
    (newest / "model.safetensors").write_bytes(bytes(data))
    edit_state(out / "checkpoints" / ck.step_name(2), lambda m: m["counters"].__setitem__("schedule_t", -5))
    code, lines = cli(capsys, "verify", str(out))
    assert code == 1 and len(lines) == 3
    assert "refused: " in lines[0] and "model.safetensors fails its sha256 check" in lines[0]
    assert lines[1].endswith("verified (the newest that verifies: resume from it with --set "
                             "checkpoint.allow_fallback=true)")
    assert "refused: " in lines[2] and "state.json: counters.schedule_t must be an integer in [0, 2]" in lines[2]
    code, lines = cli(capsys, "list", str(out))
    assert code == 0 and "val_loss" in lines[0] and "refused" in lines[1] and "verified" in lines[2]



def _rotating(monkeypatch: pytest.MonkeyPatch, step: Path, mid_read: bool) -> None:
    """The run's keep_last = 2 rotates `step` away while verify reads it: before its first file
    is opened (`mid_read`: after the manifest, with the directory's descriptor already open)."""
    from conformance.checkpoint import files
    from conformance.cli import checkpoint as cli_checkpoint

    original_read, original_load = files.read_file, cli_checkpoint.load_valid

    def read_file(path: Path, *args: Any, **kwargs: Any) -> bytes:
        if mid_read and path.parent == step and path.name != "manifest.json" and step.exists():
            ck.apply_retention(step.parent, keep_last=2)
        return original_read(path, *args, **kwargs)

    def load_valid(path: Path, *args: Any, **kwargs: Any) -> Any:
        if not mid_read and path == step:
            ck.apply_retention(step.parent, keep_last=2)
        return original_load(path, *args, **kwargs)

    monkeypatch.setattr(files, "read_file", read_file)
    monkeypatch.setattr(cli_checkpoint, "load_valid", load_valid)


@pytest.mark.parametrize("mid_read", [False, True], ids=["after-listing", "mid-read"])
def test_verify_during_rotation_says_removed_and_exits_0(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch, mid_read: bool) -> None:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run, out)
    oldest = out / "checkpoints" / ck.step_name(2)
    _rotating(monkeypatch, oldest, mid_read)
    code, lines = cli(capsys, "verify", str(out))
    assert not oldest.exists()  # the rotation did happen inside the read
    assert code == 0 and len(lines) == 3 and lines[0].endswith("verified (--resume continues from it)")
    assert lines[2] == f"{oldest}: removed while being read (the run's checkpoint.keep_last rotated it away)"
    code, lines = cli(capsys, "list", str(out))
    assert code == 0 and len(lines) == 3  # a header, then nothing left to rotate: both listed and verified


def test_negative_control_a_present_checkpoint_missing_a_file_is_refused(run: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run, out)
    oldest = out / "checkpoints" / ck.step_name(2)
    (oldest / "model.safetensors").unlink()  # the same error a rotation gives, but the checkpoint is still there
    code, lines = cli(capsys, "verify", str(out))
    assert code == 1 and "refused: " in lines[2] and "model.safetensors does not exist" in lines[2]

def test_a_missing_run_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main(["checkpoint", "verify", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"twinstep: error: {tmp_path / 'nope'}: no such directory"]


def test_warnings_are_one_line(capsys: pytest.CaptureFixture) -> None:
    show_warning(TwinstepWarning("skipping checkpoint X:\n  it is damaged"), TwinstepWarning, "/src/f.py", 12)
    show_warning(RuntimeWarning("overflow encountered in cast"), RuntimeWarning, "/src/g.py", 3)
    err = capsys.readouterr().err.splitlines()
    assert err == ["twinstep: warning: skipping checkpoint X: it is damaged",
                   "twinstep: warning: RuntimeWarning: overflow encountered in cast"]
    with warnings.catch_warnings():  # negative control: Python's own format has the source line
        text = warnings.formatwarning("m", UserWarning, "/src/f.py", 12, "warnings.warn('m')")
    assert text.count("\n") == 2 and "warnings.warn" in text


ERROR_CASE = """
id = "{kind}/returns-normally"
kind = "{kind}"
source = "hand-written: an error case whose inputs are valid"
{body}
[expected]
error = "InputError"
"""
BODIES = {
    "loss": '[loss]\nname = "mse"\n[inputs]\nprediction = [1.0, 2.0]\ntarget = [1.5, 2.0]',
    "optimizer": '[optimizer]\nname = "sgd"\nlr = 0.1\n[inputs]\nparams = { w = [1.0] }\ngrads = [ { w = [0.5] } ]',
    "schedule": '[optimizer]\nname = "sgd"\nlr = 0.1\n[schedule]\nname = "constant"\n[inputs]\nsteps = 3',
}


@pytest.mark.parametrize("kind", list(BODIES))
def test_an_error_case_whose_backend_returns_normally_says_so(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.toml"
    path.write_text(ERROR_CASE.format(kind=kind, body=BODIES[kind]))
    case = load_case(path)
    for name in ("torch", "jax", "oracle"):
        result = run_case(case, Backend(name))
        assert not result.passed and result.message == "expected InputError but the backend returned normally"
