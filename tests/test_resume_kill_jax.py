"""Exact resume of the JAX trainer (reliability.md §6 T3/T4), as tests/test_resume_kill.py for torch:
a run interrupted anywhere and resumed equals the uninterrupted run bit for bit on the CPU — final
parameters, optimizer state, and every metrics line.

The run: a tiny character-level gpt with dropout (keys: fold_in(key(run.seed), update)), AdamW,
warm-up + cosine, clipping, token-normalized accumulation of 2 with an incomplete last window,
dynamic loss scaling with injected overflows, a checkpoint every 4 updates with retention.

- Real processes: `python -m conformance train --backend jax` is killed with SIGKILL at a random
  moment of training (a few in CI, 20 with -m slow), sometimes twice, and resumed until it
  finishes; and killed at named points: while the device computes an update (a micro_batch event;
  the whole window is one compiled call) and inside a save (a checkpoint event). The
  processes share a persistent XLA compilation cache (a restart loads the compiled step instead of
  compiling it again: the same executable, so the same bits).
- Negative controls (in-process): a resume that forgets the optimizer state, the loss scale, the
  model, the schedule position or the data position fails the same check; forgetting the JAX key
  changes nothing, because the trainer's randomness is a pure function of run.seed and the update.
"""

from __future__ import annotations

import functools
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
UPDATES = 40


def env(cache: Path, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "XLA_FLAGS"))}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), JAX_COMPILATION_CACHE_DIR=str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", **extra)
    return e


def start(config: Path, out: Path, resume: bool, fault: tuple[str, dict[str, Any]] | None = None) -> subprocess.Popen:
    head = fault_args(fault[0], **fault[1]) if fault else [sys.executable, "-m", "conformance"]
    cmd = [*head, "train", str(config), "--backend", "jax", "--out", str(out),
           "--progress", "none"] + (["--resume"] if resume else [])
    cache = config.parent / "xla-cache"
    return subprocess.Popen(cmd, env=env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(config: Path, out: Path) -> None:
    proc = start(config, out, resume=True)
    _, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"resume failed with exit {proc.returncode}: {err.decode()[-2000:]}")


def _wait_for_training(proc: subprocess.Popen, out: Path) -> float:
    metrics = out / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and metrics.stat().st_size > 0:
            break
        time.sleep(0.01)
    return time.monotonic()


@pytest.fixture(scope="module")
def reference(xla_cache: Path) -> tuple[Path, Path, float]:
    tmp = xla_cache.parent  # the subprocesses share the in-process runs' compilation cache
    config = write_config(tmp, UPDATES)
    out = tmp / "reference"
    proc = start(config, out, resume=False)
    began = _wait_for_training(proc, out)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    return config, out, time.monotonic() - began


def kill_trial(reference: tuple[Path, Path, float], out: Path, seed: int) -> list[str]:
    """Kill at a random moment of training (once or twice), resume to the end, compare."""
    config, ref, duration = reference
    rng = random.Random(seed)
    resume = False
    for _ in range(1 + (rng.random() < 0.5)):
        proc = start(config, out, resume=resume)
        began = _wait_for_training(proc, out) if not resume else time.monotonic()
        # a resumed process first loads the checkpoint and the compiled step: allow for it
        time.sleep(max(0.0, rng.uniform(0.0, duration * (1.0 if not resume else 1.5)) - (time.monotonic() - began)))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=600)
        resume = True
    finish(config, out)
    return differences(ref, out, UPDATES)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_sigkill_then_resume_is_bit_exact(reference, tmp_path: Path, seed: int) -> None:
    assert kill_trial(reference, tmp_path / "run", seed) == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 120))
def test_random_sigkill_then_resume_is_bit_exact_long(reference, tmp_path: Path, seed: int) -> None:
    assert kill_trial(reference, tmp_path / "run", seed) == []


FAULTS = [("dispatched", {"update": 9}),  # while the device computes update 9 (mid-window)
          ("checkpoint", {"stage": "before_manifest"})]
MORE_FAULTS = [("dispatched", {"update": 0}), ("dispatched", {"update": UPDATES - 1}),
               ("checkpoint", {"stage": "during_retention"}), ("checkpoint", {"stage": "after_first_file"}),
               ("checkpoint", {"stage": "after_manifest"}), ("checkpoint", {"stage": "after_rename"})]


def fault_trial(reference: tuple[Path, Path, float], out: Path, name: str, point: dict[str, Any]) -> list[str]:
    config, ref, _ = reference
    proc = start(config, out, resume=False, fault=(name, point))
    proc.communicate(timeout=600)
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
# in-process run cut back to its checkpoint after 20 updates)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_run(reference, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The reference config run in this process, keeping every checkpoint."""
    from ref_jax.trainer import train

    config = reference[0]
    out = tmp_path_factory.mktemp("full-jax") / "run"
    train(load_config(config, ["checkpoint.keep_last=100"]), out, progress="none")
    assert differences(reference[1], out, UPDATES) == []  # in-process and subprocess runs are the same bits
    return config, out


@pytest.fixture(autouse=True, scope="module")
def xla_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A persistent compilation cache for this module's in-process runs: each resume of the same
    config loads the compiled step instead of compiling it again (the same executable, the same
    bits); the subprocesses use the same directory. Scoped to the module and reset afterwards."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                                 "jax_persistent_cache_min_compile_time_secs")}
    cache = tmp_path_factory.mktemp("resume-jax") / "xla-cache"
    cc.reset_cache()
    cc.set_cache_dir(str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield cache
    cc.reset_cache()
    for k, v in saved.items():
        jax.config.update(k, v)


def _resume(full_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget: str | None,
            at: int = 20) -> list[str]:
    import ref_jax.trainer as jt
    from ref_jax import _train_state as ts

    config, full = full_run
    out = tmp_path / "run"
    shutil.copytree(full, out)
    for update, path in ck.list_checkpoints(out / "checkpoints"):
        if update > at:
            shutil.rmtree(path)
    if forget in ts.PIECES:
        monkeypatch.setattr(ts, "initial_state", functools.partial(ts.initial_state, skip=frozenset({forget})))
    elif forget == "data":
        real = jt._prepare
        monkeypatch.setattr(jt, "_prepare", lambda run, parts, place, t: real(run, parts, place, t - run.start))
    jt.train(load_config(config, ["checkpoint.keep_last=100"]), out, resume=True, progress="none")
    return differences(full, out, UPDATES)


def test_in_process_resume_is_bit_exact(full_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _resume(full_run, tmp_path, monkeypatch, None) == []


@pytest.mark.parametrize("forget", ["optimizer", "loss_scale", "model", "schedule", "data"])
def test_resume_that_forgets_state_is_caught(full_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             forget: str) -> None:
    assert _resume(full_run, tmp_path, monkeypatch, forget) != []


def test_the_jax_key_is_no_state(full_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # dropout draws from fold_in(key(run.seed), update): a resume without the saved key is the same run
    assert _resume(full_run, tmp_path, monkeypatch, "rng") == []
