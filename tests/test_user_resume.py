"""Exact resume with your own model, one test body per trainer (`[torch]`, `[jax]`): a
run of a user's torch nn.Module / Flax NNX module on a user's arrays, killed with SIGKILL and
resumed, equals the uninterrupted run bit for bit on the CPU (parameters, optimizer state, buffers
and NNX state, loss scale, counters, every metrics line).

The run (tests/support/user_models.py, kind "bn"): Linear → BatchNorm → ReLU → Dropout → Linear
(torch: running statistics are buffers and dropout draws from the global generator; NNX: BatchStat
and the module's nnx.Rngs are state), AdamW, warm-up + cosine, clipping, token-normalized
accumulation of 2, dynamic loss scaling with injected overflows, evaluations, a checkpoint every 4
updates. Real processes killed at a random moment and at named points (inside update 9's window,
inside a save; tests/support/faults.py), resumed with --resume until done.

Negative controls, in process from a copy of the reference cut back to its checkpoint after 12
updates: a resume that does not restore the model's buffers / state (BatchNorm statistics back at
their initial values) fails the same check, and on JAX one that forgets the NNX RNG state.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.processes import PROCESS_S, wait_for, wait_until
from support.resume import differences
from support.user_models import blobs, config, model

from conformance import checkpoint as ck
from conformance.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "support" / "user_models.py"
UPDATES, CUT = 30, 12
INSIDE = {"torch": ("micro_batch", {"update": 9, "index": 1}), "jax": ("dispatched", {"update": 9})}
FORGET = {"torch": {"buffers": ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked")},
          "jax": {"buffers": ("bn.mean", "bn.var"), "rng": ("drop.rngs.count",)}}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A persistent XLA cache shared by this module's JAX processes and in-process runs."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                                 "jax_persistent_cache_min_compile_time_secs")}
    where = tmp_path_factory.mktemp("user-resume-xla")
    cc.reset_cache()
    cc.set_cache_dir(str(where))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield where
    cc.reset_cache()
    for k, v in saved.items():
        jax.config.update(k, v)


def start(framework: str, out: Path, cache: Path, resume: bool, fault: tuple[str, dict] | None = None,
          *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "XLA_FLAGS", "RANK", "WORLD_SIZE"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    cmd = [sys.executable, str(SCRIPT), framework, str(out), *extra, *(["--resume"] if resume else [])]
    if fault is not None:
        cmd += ["--fault", fault[0], *(f"{k}={v}" for k, v in fault[1].items())]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(framework: str, out: Path, cache: Path) -> None:
    proc = start(framework, out, cache, True)
    _, err = wait_for(proc, "finish the resumed run", PROCESS_S)
    assert proc.returncode == 0, err.decode()[-2000:]


@pytest.fixture(scope="module")
def references(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    made: dict[str, tuple[Path, float]] = {}

    def get(framework: str) -> tuple[Path, float]:
        if framework not in made:
            out = tmp_path_factory.mktemp(f"user-{framework}") / "reference"
            proc = start(framework, out, cache, False, None, "--set", "checkpoint.keep_last=100")
            wait_until(proc, (out / "metrics.jsonl").exists, f"create {out / 'metrics.jsonl'}")
            began = time.monotonic()
            _, err = wait_for(proc, "finish the reference run", PROCESS_S)
            assert proc.returncode == 0, err.decode()[-2000:]
            made[framework] = (out, time.monotonic() - began)
        return made[framework]

    return get


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_random_sigkill_then_resume_is_bit_exact(framework: str, references: Any, cache: Path, tmp_path: Path) -> None:
    ref, duration = references(framework)
    out = tmp_path / "run"
    proc = start(framework, out, cache, False)
    wait_until(proc, (out / "metrics.jsonl").exists, f"create {out / 'metrics.jsonl'}")
    time.sleep(random.Random(framework).uniform(0.2, 0.9) * duration)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    wait_for(proc, "end", PROCESS_S)
    finish(framework, out, cache)
    assert differences(ref, out, UPDATES) == []


def _points() -> list[Any]:
    return [pytest.param(f, point, id=f"{point[0]}[{f}]") for f in ("torch", "jax")
            for point in (INSIDE[f], ("checkpoint", {"stage": "before_manifest"}))]


@pytest.mark.parametrize(("framework", "point"), _points())
def test_crash_at_named_point_then_resume_is_bit_exact(framework: str, point: Any, references: Any, cache: Path,
                                                       tmp_path: Path) -> None:
    ref, _ = references(framework)
    out = tmp_path / "run"
    proc = start(framework, out, cache, False, point)
    wait_for(proc, f"die at {point[0]}", PROCESS_S)
    assert proc.returncode == 137, f"the fault point {point} was never reached"
    finish(framework, out, cache)
    assert differences(ref, out, UPDATES) == []


def _forgotten(found: ck.Checkpoint, names: tuple[str, ...]) -> ck.Checkpoint:
    """The checkpoint as a resume that does not restore these tensors sees it: the values a fresh
    module starts with (running mean 0, variance 1, counts 0)."""
    fresh = {k: (np.ones_like(v) if k.endswith(("var", "running_var")) else np.zeros_like(v))
             for k, v in found.state.model.items() if k in names}
    return found._replace(state=found.state._replace(model={**found.state.model, **fresh}))


def resume_in_process(framework: str, ref: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      forget: str | None) -> list[str]:
    out = tmp_path / "run"
    shutil.copytree(ref, out)
    for update, path in ck.list_checkpoints(out / "checkpoints"):
        if update > CUT:
            shutil.rmtree(path)
    calls: list[int] = []
    if forget is not None:
        real = ck.load_checkpoint

        def load(path: Any, **kwargs: Any) -> ck.Checkpoint:
            calls.append(1)
            return _forgotten(real(path, **kwargs), FORGET[framework][forget])

        monkeypatch.setattr(ck, "load_checkpoint", load)
    train = importlib.import_module(f"ref_{framework}.trainer").train
    train(load_config(config(), ["checkpoint.keep_last=100"]), out, model=model(framework), data=blobs(), resume=True,
          progress="none")
    assert forget is None or calls, "the planted bug was never reached"
    return differences(ref, out, UPDATES)


def _controls() -> list[Any]:
    return [pytest.param(f, piece, id=f"{piece}[{f}]") for f in ("torch", "jax") for piece in (None, *FORGET[f])]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(("framework", "forget"), _controls())
def test_in_process_resume_and_its_negative_controls(framework: str, forget: str | None, references: Any,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, _ = references(framework)
    found = resume_in_process(framework, ref, tmp_path, monkeypatch, forget)
    assert (found == []) is (forget is None), found
