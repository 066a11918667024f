"""Crash safety of checkpoint writing, with real processes (reliability.md §6 T1, T13).

A child process saves checkpoints in a loop; the parent kills it with SIGKILL at a random moment
and checks that the newest checkpoint found is complete, verified and self-consistent, and that
nothing the child reported as saved was lost. The negative control runs a naive writer (files
overwritten in place, no manifest) under the same kills and must see corruption. A few trials run
in CI; `-m slow` runs 25 of each with a 32 MiB state. Named crash points (save_checkpoint's `events`
observer exits at one checkpoint stage) die exactly between the steps of a save.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.processes import PROCESS_S, wait_for
import safetensors.numpy

from conformance import checkpoint as ck

CHILD = r'''
import json, os, sys, time
import numpy as np
from conformance import checkpoint as ck

directory, mode, n, fault, keep = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])

def state(u):
    return ck.TrainingState(
        u, {"a": np.full(n, u, np.float32), "b": np.full(n // 2, -u, np.float32)},
        {"a": {"m": np.full(n // 4, u, np.float64)}}, {"k": np.array([u, u], np.uint32)},
        {"update": u}, f"u = {u}\n")

def header(tensors):
    # safetensors layout: 8-byte little-endian header length, JSON header, then the raw data.
    meta, offset = {}, 0
    for k, v in tensors.items():
        meta[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
        offset += v.nbytes
    text = json.dumps(meta).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text

def naive_save(s):
    # Overwrite one directory in place, streaming the tensors as they are serialized (as torch.save does).
    d = os.path.join(directory, "latest")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(header(s.model))
        for v in s.model.values():
            for i in range(0, v.size, 1 << 14):
                f.write(v[i:i + (1 << 14)].tobytes())
                f.flush()
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump(s.meta, f)

def die_at(stage):
    # from the second save on, exit abruptly at one stage of it (as SIGKILL would)
    return lambda event, info: os._exit(137) if info.get("stage") == stage else None

u = 0
while True:
    u += 1
    s = state(u)
    t = time.perf_counter()
    if mode == "atomic":
        ck.save_checkpoint(directory, s, keep_last=keep, events=die_at(fault) if fault and u > 1 else None)
    else:
        naive_save(s)
    print(f"saved {u} {time.perf_counter() - t:.6f}", flush=True)
'''

ROOT = Path(__file__).resolve().parents[1]
CI_TRIALS, SLOW_TRIALS = 3, 25
CI_FLOATS, SLOW_FLOATS = 1 << 20, 1 << 23  # model "a" alone: 4 MiB in CI, 32 MiB with -m slow


def start(directory: Path, mode: str, n: int, fault: str = "", keep: int = 2) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(directory), mode, str(n), fault, str(keep)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def kill_at_random(proc: subprocess.Popen, rng: random.Random) -> int:
    """Wait for the first save, sleep U(0, 1.5 · its duration), SIGKILL; the last reported update."""
    first = proc.stdout.readline().split()
    assert first and first[0] == "saved", proc.stderr.read()
    time.sleep(rng.uniform(0.0, 1.5 * max(float(first[2]), 0.01)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    lines = [int(line.split()[1]) for line in proc.stdout.read().splitlines() if line.startswith("saved")]
    return max([int(first[1]), *lines])


def check_atomic(directory: Path, reported: int, keep: int) -> int:
    """The kill test's check: the latest checkpoint is found, verifies, is self-consistent and is
    not older than anything the child reported; crash leftovers are cleaned on the next start."""
    latest = ck.find_latest(directory)
    assert latest is not None, "no checkpoint survived although one was committed"
    state = ck.load_checkpoint(latest).state
    u = state.update
    assert u >= reported, f"update {reported} was reported saved but the latest is {u}"
    assert np.all(state.model["a"] == u) and np.all(state.model["b"] == -u) and np.all(state.optimizer["a"]["m"] == u)
    assert state.meta == {"update": u} and state.config == f"u = {u}\n" and np.all(state.rng["k"] == u)
    assert len(ck.list_checkpoints(directory)) <= keep + 1  # deletion runs after the commit
    ck.prepare_directory(directory)
    assert not [p for p in os.listdir(directory) if p.startswith(".tmp-")]
    return u


def naive_is_corrupt(directory: Path) -> bool:
    """The same consistency check applied to the naive writer's single directory."""
    try:
        model = safetensors.numpy.load((directory / "latest" / "model.safetensors").read_bytes())
        u = json.loads((directory / "latest" / "state.json").read_text())["update"]
        return not (np.all(model["a"] == u) and np.all(model["b"] == -u))
    except Exception:
        return True


def kill_trials(tmp_path: Path, trials: int, n: int, seed: int) -> None:
    rng = random.Random(seed)
    for trial in range(trials):
        directory = tmp_path / f"atomic-{trial}"
        reported = kill_at_random(start(directory, "atomic", n), rng)
        check_atomic(directory, reported, keep=2)
        ck.save_checkpoint(directory, ck.load_checkpoint(ck.find_latest(directory)).state._replace(update=10**6),
                           keep_last=2)
        assert len(ck.list_checkpoints(directory)) == 2, f"trial {trial} (seed {seed})"


def naive_trials(tmp_path: Path, trials: int, n: int, seed: int, stop_at_first: bool = False) -> int:
    rng = random.Random(seed)
    corrupt = 0
    for trial in range(trials):
        directory = tmp_path / f"naive-{trial}"
        kill_at_random(start(directory, "naive", n), rng)
        corrupt += naive_is_corrupt(directory)
        if stop_at_first and corrupt:
            break
    return corrupt


def test_random_kills_leave_a_loadable_latest(tmp_path) -> None:
    kill_trials(tmp_path, CI_TRIALS, CI_FLOATS, seed=20260101)


def test_negative_control_naive_writer_is_corrupted_by_the_same_kills(tmp_path) -> None:
    # Trials until the first corruption (measured: 12 of 20 kills corrupt it; 12 tries miss with p ≈ 2e-5).
    corrupt = naive_trials(tmp_path, 12, CI_FLOATS, seed=20260102, stop_at_first=True)
    assert corrupt >= 1, "the kill test failed to catch a non-atomic writer"


@pytest.mark.slow
def test_many_random_kills(tmp_path) -> None:
    kill_trials(tmp_path, SLOW_TRIALS, SLOW_FLOATS, seed=int(os.environ.get("KILL_SEED", "7")))
    # the negative control: the same kills corrupt a naive writer (how often depends on the machine's
    # load: 4 of 25 measured under load, about 12 of 20 idle), so the atomic result above is not for
    # want of kills mid-write
    corrupt = naive_trials(tmp_path, SLOW_TRIALS, SLOW_FLOATS, seed=8)
    assert corrupt >= 1, f"naive writer corrupted in none of {SLOW_TRIALS} kills"


@pytest.mark.parametrize("point, expect", [
    ("after_first_file", 1), ("during_files", 1), ("before_manifest", 1), ("after_manifest", 1),
    ("after_rename", 2), ("during_retention", 2),
])
def test_crash_points_inside_a_save(tmp_path, point: str, expect: int) -> None:
    proc = start(tmp_path, "atomic", 1 << 12, fault=point, keep=1)
    out, err = wait_for(proc, f"crash at {point}", PROCESS_S)
    assert proc.returncode == 137, f"the fault point {point} was never reached: {err}"
    assert check_atomic(tmp_path, reported=1, keep=1) == expect
    assert [u for u, _ in ck.list_checkpoints(tmp_path)] in ([expect], [2, 1])
