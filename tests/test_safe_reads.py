"""Open nothing blindly (conformance/files.py): a FIFO in place of any checkpoint file is
refused at once (it used to block `--resume` forever: the file was opened before its type was
checked), and nothing inside a checkpoint can lead out of it through a link.

The hang guard runs each read in a thread that must finish within seconds; the negative control is
a naive read of the same FIFO, which is still blocked when the guard gives up on it.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.processes import PROCESS_S, run_process

from conformance import checkpoint as ck
from conformance.errors import CheckpointCorruptError, CheckpointRejected

ROOT = Path(__file__).resolve().parents[1]
ALL_FILES = [*ck.FILES, ck.MANIFEST]


def small_checkpoint(directory: Path) -> Path:
    state = ck.TrainingState(update=3, model={"w": np.arange(3, dtype=np.float32)}, config="[run]\nseed = 1\n")
    return ck.save_checkpoint(directory, state)


def finishes(fn: Any, seconds: float = 10.0) -> Any:
    """fn() run in a thread that must end within `seconds` (a hang fails, it does not hang the suite)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  (handed back to the test)
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.parametrize("name", ALL_FILES)
def test_a_fifo_in_place_of_any_checkpoint_file_is_refused_at_once(tmp_path: Path, name: str) -> None:
    step = small_checkpoint(tmp_path)
    (step / name).unlink()
    os.mkfifo(step / name, 0o600)
    with pytest.raises(CheckpointRejected, match=f"{name} is a FIFO"):
        finishes(lambda: ck.load_checkpoint(step))
    with pytest.raises(CheckpointCorruptError, match="no checkpoint under .* verifies"):
        finishes(lambda: ck.find_latest(tmp_path, allow_fallback=True, on_skip=lambda p, e: None))


def test_negative_control_a_naive_read_of_the_fifo_blocks(tmp_path: Path) -> None:
    step = small_checkpoint(tmp_path)
    (step / "rng.safetensors").unlink()
    os.mkfifo(step / "rng.safetensors", 0o600)
    with pytest.raises(AssertionError, match="still blocked"):
        finishes(lambda: (step / "rng.safetensors").read_bytes(), seconds=0.5)
    with open(step / "rng.safetensors", "wb"):  # release the blocked reader
        pass


def test_resume_with_a_fifo_checkpoint_file_exits_2_without_hanging(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TWINSTEP_")}, "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "conformance", "train", "--out", str(out), "--set", "run.max_updates=2",
           "--progress", "none"]
    assert run_process(cmd, "train 2 updates", PROCESS_S, env=env, capture_output=True).returncode == 0
    step = out / "checkpoints" / ck.step_name(2)
    for name in ("rng.safetensors", ck.MANIFEST):
        (step / name).unlink()
        os.mkfifo(step / name, 0o600)
    proc = run_process([*cmd, "--resume"], "refuse the FIFO", PROCESS_S, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("twinstep: error: ") and "is a FIFO" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_linked_step_or_checkpoints_directory_is_refused(tmp_path: Path) -> None:
    real = small_checkpoint(tmp_path / "elsewhere")
    inside = tmp_path / "run" / "checkpoints"
    inside.mkdir(parents=True)
    (inside / ck.step_name(3)).symlink_to(real)
    with pytest.raises(CheckpointRejected, match="symbolic link"):
        ck.load_checkpoint(inside / ck.step_name(3))
    shutil.rmtree(inside)
    inside.symlink_to(real.parent)  # checkpoints/ itself pointing out of the run
    with pytest.raises(CheckpointRejected, match="checkpoints is a symbolic link"):
        ck.find_latest(inside)
    with pytest.raises(CheckpointRejected, match="checkpoints is a symbolic link"):
        ck.prepare_directory(inside)


def test_a_file_growing_past_its_manifest_size_is_refused(tmp_path: Path) -> None:
    step = small_checkpoint(tmp_path)
    with open(step / "state.json", "ab") as f:
        f.write(b" ")
    with pytest.raises(CheckpointRejected, match="state.json has .* bytes; a file of this checkpoint may have"):
        ck.load_checkpoint(step)
