"""Exact resume (reliability.md §6 T3/T4): a run interrupted anywhere and resumed equals the
uninterrupted run bit for bit — final parameters, optimizer state, and every metrics line.

The run is a tiny character-level gpt with dropout (the torch RNG matters), AdamW, warm-up +
cosine, clipping, token-normalized accumulation of 2 with an incomplete last window every epoch,
dynamic loss scaling with injected overflows (the scale and skip counters change) and a checkpoint
every 4 updates with retention. It crosses epoch boundaries.

- Real processes: `python -m conformance train` is killed with SIGKILL at a random moment after
  training has begun (a few in CI, 24 with -m slow), sometimes twice, and resumed with --resume
  until it finishes; and killed at named points: inside an accumulation window
  (a micro_batch event) and inside a save (a checkpoint event).
- Negative controls (in-process, fast): a resume that forgets the RNG, the optimizer state, the
  loss scale, the schedule position or the data position must fail the same check.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.faults import fault_args
from support.resume import differences, write_config

from conformance import checkpoint as ck
from conformance.config import load_config

ROOT = Path(__file__).resolve().parents[1]
UPDATES = 48


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("TWINSTEP_")}
    e.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return e


def start(config: Path, out: Path, resume: bool, fault: tuple[str, dict[str, Any]] | None = None) -> subprocess.Popen:
    head = fault_args(fault[0], **fault[1]) if fault else [sys.executable, "-m", "conformance"]
    cmd = [*head, "train", str(config), "--backend", "torch", "--out", str(out),
           "--progress", "none"] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(config: Path, out: Path, attempts: int = 4) -> None:
    for _ in range(attempts):
        proc = start(config, out, resume=True)
        _, err = proc.communicate(timeout=300)
        if proc.returncode == 0:
            return
        pytest.fail(f"resume failed with exit {proc.returncode}: {err.decode()[-2000:]}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    tmp = tmp_path_factory.mktemp("resume")
    config = write_config(tmp, UPDATES)
    out = tmp / "reference"
    proc = start(config, out, resume=False)
    began = _wait_for_training(proc, out)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    return config, out, time.monotonic() - began


def _wait_for_training(proc: subprocess.Popen, out: Path) -> float:
    metrics = out / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and metrics.stat().st_size > 0:
            break
        time.sleep(0.01)
    return time.monotonic()


def kill_trial(reference: tuple[Path, Path, float], out: Path, seed: int) -> list[str]:
    """Kill at a random moment of training (once or twice), resume to the end, compare."""
    config, ref, duration = reference
    rng = random.Random(seed)
    resume = False
    for _ in range(1 + (rng.random() < 0.5)):
        proc = start(config, out, resume=resume)
        _wait_for_training(proc, out) if not resume else None
        time.sleep(rng.uniform(0.0, duration * (1.0 if not resume else 1.5)))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=300)
        resume = True
    finish(config, out)
    return differences(ref, out, UPDATES)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_sigkill_then_resume_is_bit_exact(reference, tmp_path: Path, seed: int) -> None:
    assert kill_trial(reference, tmp_path / "run", seed) == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 124))
def test_random_sigkill_then_resume_is_bit_exact_long(reference, tmp_path: Path, seed: int) -> None:
    assert kill_trial(reference, tmp_path / "run", seed) == []


FAULTS = [("micro_batch", {"update": 9, "index": 1}),  # inside update 9's window, after its first micro-batch
          ("checkpoint", {"stage": "before_manifest"}),
          ("checkpoint", {"stage": "during_retention"})]
MORE_FAULTS = [("micro_batch", {"update": 0, "index": 0}), ("micro_batch", {"update": 47, "index": 1}),
               ("checkpoint", {"stage": "after_first_file"}), ("checkpoint", {"stage": "after_manifest"}),
               ("checkpoint", {"stage": "after_rename"})]


def fault_trial(reference: tuple[Path, Path, float], out: Path, name: str, point: dict[str, Any]) -> list[str]:
    config, ref, _ = reference
    proc = start(config, out, resume=False, fault=(name, point))
    proc.communicate(timeout=300)
    assert proc.returncode == 137, f"the fault point {point} was never reached"
    finish(config, out)
    return differences(ref, out, UPDATES)


@pytest.mark.parametrize(("name", "point"), FAULTS)
def test_crash_at_named_point_then_resume_is_bit_exact(reference, tmp_path: Path, name: str, point: dict[str, Any]) -> None:
    assert fault_trial(reference, tmp_path / "run", name, point) == []


@pytest.mark.slow
@pytest.mark.parametrize(("name", "point"), MORE_FAULTS)
def test_crash_at_more_points_then_resume_is_bit_exact(reference, tmp_path: Path, name: str, point: dict[str, Any]) -> None:
    assert fault_trial(reference, tmp_path / "run", name, point) == []


# ---------------------------------------------------------------------------------------------
# The check has teeth: resumes that forget a piece of state fail it (in-process, from a copy of the
# reference run cut back to its checkpoint after 20 updates)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    # in-process runs: one intra-op thread, as the subprocesses (tiny ops; 2 shared cores)
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def full_run(reference, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The reference config run in this process, keeping every checkpoint."""
    from ref_torch.trainer import train

    config = reference[0]
    out = tmp_path_factory.mktemp("full") / "run"
    train(load_config(config, ["checkpoint.keep_last=100"]), out, progress="none")
    return config, out


def _resume(full_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget: str | None,
            at: int = 20) -> list[str]:
    import ref_torch.trainer as tr
    from ref_torch import _train_state

    config, full = full_run
    out = tmp_path / "run"
    shutil.copytree(full, out)
    for update, path in ck.list_checkpoints(out / "checkpoints"):
        if update > at:
            shutil.rmtree(path)
    if forget in _train_state.PIECES:
        monkeypatch.setattr(tr, "_restore", lambda c, o, r: _train_state.restore(c, o, r, skip=frozenset({forget})))
    elif forget == "schedule":
        real = tr.build_scheduler
        monkeypatch.setattr(tr, "build_scheduler", lambda *a, **k: real(*a, **{**k, "start": 0}))
    elif forget == "data":
        monkeypatch.setattr(tr, "_data_window", lambda run, t: run.data.window(t - run.start))
    tr.train(load_config(config, ["checkpoint.keep_last=100"]), out, resume=True, progress="none")
    return differences(full, out, UPDATES)


def test_in_process_resume_is_bit_exact(full_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _resume(full_run, tmp_path, monkeypatch, None) == []


@pytest.mark.parametrize("forget", ["rng", "optimizer", "loss_scale", "schedule", "data"])
def test_resume_that_forgets_state_is_caught(full_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             forget: str) -> None:
    assert _resume(full_run, tmp_path, monkeypatch, forget) != []
