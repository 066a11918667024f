"""The hostile probes, as a hostile user would run them (`-m slow`): no probe may end in "internal error"
or a traceback, and nothing already saved may be lost.

- random SIGKILL / SIGTERM of real `twinstep train` processes on both trainers, resumed until done:
  the end equals the uninterrupted run bit for bit;
- bit flips and truncations of every checkpoint file; every leaf of state.json set to a value of
  the wrong type or range, re-hashed: each refused, one line naming state.json (exit 2);
- a FIFO and a symbolic link in every position of a run directory: refused within seconds, exit 2;
- two runs started 0.3 s apart into one --out: one runs, the other is refused naming its pid;
- full and read-only disks: a real small tmpfs where this machine allows mounting (a run fills it
  at different points), else SIMULATED ENOSPC (os.write patched in-process after N writes to files of
  the run directory); each a one-line error naming a path, and the resume after space is freed
  equals the uninterrupted run.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.processes import PROCESS_S, wait_for, wait_until
from support.resume import differences
from support.tamper import edit_state, write

from conformance import checkpoint as ck
from conformance import tomlio
from conformance.cli import main
from conformance.errors import CheckpointError
from conformance.run.resume import load_valid

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SMALL = {"run": {"max_updates": 4, "progress": "none", "device": "cpu"}, "checkpoint": {"every": 2, "keep_last": 5},
         "precision": {"loss_scale": "dynamic", "init_scale": 1024.0, "growth_interval": 3}}


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "RANK", "WORLD_SIZE", "MASTER_"))}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return e


def clean(err: str) -> bool:
    return "Traceback" not in err and "internal error" not in err


def _small(base: Path, backend: str) -> tuple[Path, Path]:
    config = base / "config.toml"
    config.write_text(tomlio.dumps(SMALL))
    assert main(["train", str(config), "--backend", backend, "--out", str(base / "run")]) == 0
    return base / "run", config


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished torch run of SMALL (4 updates, checkpoints after 2 and 4) and its config file."""
    return _small(tmp_path_factory.mktemp("probe"), "torch")


@pytest.fixture(scope="module")
def small_jax(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _small(tmp_path_factory.mktemp("probe-jax"), "jax")


def resume(config: Path, out: Path, capsys: pytest.CaptureFixture, seconds: float = 60,
           backend: str = "torch") -> tuple[int, list[str]]:
    """`twinstep train --resume` in process, in a thread that must finish in time (no hang)."""
    capsys.readouterr()
    box: list[int] = []
    args = ["train", str(config), "--backend", backend, "--out", str(out), "--resume"]
    thread = threading.Thread(target=lambda: box.append(main(args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"resume of {out} still running after {seconds} s"
    return box[0], capsys.readouterr().err.strip().splitlines()


def copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / f"run-{random.getrandbits(32):08x}"
    shutil.copytree(run, out, symlinks=True)
    return out


# --- bit flips, truncations, re-hashed fields ----------------------------------------------------


def test_bit_flips_and_truncations_of_every_file_are_refused(small: tuple[Path, Path], tmp_path: Path) -> None:
    rng = random.Random(16)
    step = copy(small[0], tmp_path) / "checkpoints" / ck.step_name(4)
    accepted = []
    for name in [*ck.FILES, ck.MANIFEST]:
        pristine = (step / name).read_bytes()
        trials = [bytearray(pristine) for _ in range(100)]
        for t in trials:
            t[rng.randrange(len(t))] ^= 1 << rng.randrange(8)
        trials += [bytearray(pristine[: rng.randrange(len(pristine))]) for _ in range(20)]
        for damaged in trials:
            write(step / name, bytes(damaged))
            try:
                load_valid(step)
                accepted.append((name, bytes(damaged)))
            except CheckpointError:
                pass
        write(step / name, pristine)
    assert accepted == []
    load_valid(step)


def _leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, (*path, k))]
    return [(path, node)]


def _bad_values(value: Any) -> list[Any]:
    """Values of the wrong type or range for a leaf holding `value` (never an equally valid one: a
    float leaf may hold any finite float, a null one a number)."""
    out: list[Any] = [[], {}]
    if isinstance(value, bool):
        out += ["yes", 7, None]
    elif isinstance(value, int):
        out += ["1", -1, 2**70, 1.5, True, None]
    elif isinstance(value, float):
        out += ["0.5", "1e999-as-inf", True]
    elif isinstance(value, str):
        out += [value + "-changed", 7, True, None]
    elif value is None:
        out += ["none", True]
    return out


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_every_state_field_with_a_bad_value_is_refused(request: pytest.FixtureRequest, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture, backend: str) -> None:
    run, config = request.getfixturevalue("small" if backend == "torch" else "small_jax")
    meta = json.loads((run / "checkpoints" / ck.step_name(4) / "state.json").read_bytes())
    accepted, probes = [], 0
    for path, value in _leaves(meta):
        for bad in _bad_values(value):
            out = copy(run, tmp_path)
            step = out / "checkpoints" / ck.step_name(4)

            def change(m: dict[str, Any], path: tuple[str, ...] = path, bad: Any = bad) -> None:
                node = m
                for part in path[:-1]:
                    node = node[part]
                node[path[-1]] = 0.25 if bad == "1e999-as-inf" else bad

            raw = (lambda text: text.replace("0.25", "1e999")) if bad == "1e999-as-inf" else None
            edit_state(step, change, raw)
            code, err = resume(config, out, capsys, backend=backend)
            probes += 1
            named = "state.json" in err[0] or "checkpoint data position" in err[0] if err else False
            if code != 2 or len(err) != 1 or not named or not clean(err[0]):
                accepted.append((".".join(path), bad, code, err))
            shutil.rmtree(out)
    assert probes > 150 and accepted == [], accepted[:5]


# --- FIFOs and links in every position ---------------------------------------------------------


POSITIONS = ["config.toml", "metrics.jsonl", ".twinstep.lock", "checkpoints",
             f"checkpoints/{ck.step_name(4)}", *(f"checkpoints/{ck.step_name(4)}/{n}" for n in [*ck.FILES, ck.MANIFEST])]


@pytest.mark.parametrize("kind", ["fifo", "link"])
@pytest.mark.parametrize("where", POSITIONS)
def test_a_fifo_or_a_link_in_any_position_is_refused_at_once(small: tuple[Path, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture, kind: str, where: str) -> None:
    run, config = small
    out = copy(run, tmp_path)
    target = out / where
    moved = tmp_path / "moved"
    os.replace(target, moved)
    if kind == "fifo":
        os.mkfifo(target, 0o600)
    else:
        target.symlink_to(moved)
    code, err = resume(config, out, capsys, seconds=30)
    assert code == 2 and len(err) == 1 and err[0].startswith("twinstep: error: ") and clean(err[0]), err
    assert where.split("/")[-1] in err[0]


# --- concurrent runs ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_two_runs_into_one_out_one_runs_the_other_is_refused(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "conformance", "train", "--backend", backend, "--out", str(out), "--progress", "none",
           "--set", "run.max_updates=200", "--set", "checkpoint.every=10"]
    first = subprocess.Popen(cmd, env=env(), stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    second = subprocess.Popen(cmd, env=env(), stderr=subprocess.PIPE, text=True)
    results = {}
    for p in (first, second):
        _, err = wait_for(p, "finish or be refused", PROCESS_S)
        results[p.pid] = (p.returncode, err)
    codes = sorted(code for code, _ in results.values())
    assert codes == [0, 2], results
    (winner,) = [pid for pid, (code, _) in results.items() if code == 0]
    (loser_err,) = [err for code, err in results.values() if code == 2]
    assert f"is in use by another twinstep run (pid {winner})" in loser_err and clean(loser_err)
    for _, path in ck.list_checkpoints(out / "checkpoints"):
        load_valid(path)
    assert len(ck.list_checkpoints(out / "checkpoints")) >= 1


# --- random SIGKILL / SIGTERM ------------------------------------------------------------------


def _config(tmp: Path) -> Path:
    from support.trainers import gpt_dropout

    cfg = gpt_dropout(tmp)
    cfg = {**cfg, "run": {**cfg["run"], "max_updates": 30, "eval_every": 7}, "checkpoint": {"every": 5}}
    path = tmp / "kill.toml"
    path.write_text(tomlio.dumps(cfg))
    return path


def _training(out: Path, since: float, proc: subprocess.Popen) -> None:
    """Wait until this process has written a metrics line (training is under way) or has ended."""
    path = out / "metrics.jsonl"

    def written() -> bool:
        try:
            return path.stat().st_mtime > since and path.stat().st_size > 0
        except FileNotFoundError:
            return False

    wait_until(proc, written, f"write a line to {path}")


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_random_sigkill_and_sigterm_then_resume_is_bit_exact(tmp_path: Path, backend: str) -> None:
    rng = random.Random(f"kill-{backend}")
    config = _config(tmp_path)
    cmd = [sys.executable, "-m", "conformance", "train", str(config), "--backend", backend, "--progress", "none"]
    ref = tmp_path / "ref"
    proc = subprocess.Popen([*cmd, "--out", str(ref)], env=env(), stderr=subprocess.PIPE, text=True)
    _training(ref, 0.0, proc)
    began = time.time()
    wait_for(proc, "finish the reference run", PROCESS_S)
    assert proc.returncode == 0
    duration = max((ref / "metrics.jsonl").stat().st_mtime - began, 0.05)  # the first to the last metrics line
    preempted = 0
    for trial in range(5):
        out = tmp_path / f"trial{trial}"
        resume_flag: list[str] = []
        history: list[tuple[str, float, int, str]] = []
        for attempt in range(5):  # up to 4 interruptions, then the run may finish
            since = time.time()
            proc = subprocess.Popen([*cmd, "--out", str(out), *resume_flag], env=env(), stderr=subprocess.PIPE,
                                    text=True)
            sig, delay = rng.choice([signal.SIGKILL, signal.SIGTERM]), rng.uniform(0.0, duration)
            _training(out, since, proc)
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.005)
            sent = proc.poll() is None and attempt < 4
            if sent:
                proc.send_signal(sig)
            _, err = wait_for(proc, "end", PROCESS_S)
            code = proc.returncode
            history.append((sig.name if sent else "-", round(delay, 2), code, err[-300:]))
            # SIGTERM after the run's handler is removed (at exit) ends it as the default action does
            assert clean(err) and code in (0, -signal.SIGKILL, -signal.SIGTERM, 143), history
            resume_flag = ["--resume"]
            if code == 0:
                break
        assert code == 0 and differences(ref, out, 30) == [], (trial, history, differences(ref, out, 30))
        preempted += sum(h[0] == "SIGTERM" and h[2] == 143 for h in history)
    assert preempted > 0  # the SIGTERM path (save, stop, resume) was exercised, not only SIGKILL


# --- full and read-only disks ------------------------------------------------------------------


def _mount(mnt: Path, size: str) -> bool:
    mnt.mkdir(exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                          capture_output=True).returncode == 0


def _simulated_enospc(monkeypatch: pytest.MonkeyPatch, root: Path, after: int) -> None:
    """SIMULATED full disk (labelled; no file system is filled): every write to a file under `root`
    after the first `after` fails with ENOSPC."""
    real, calls = os.write, [0]

    def write_(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root)):
            calls[0] += 1
            if calls[0] > after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write_)


@pytest.mark.parametrize("fill", range(6))
def test_a_full_disk_at_any_point_is_one_line_and_the_resume_is_exact(small: tuple[Path, Path], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch, fill: int) -> None:
    run, config = small
    mnt = tmp_path / "mnt"
    real = _mount(mnt, f"{16 + 16 * fill}k")  # a finished run needs about 108 KiB of 4 KiB pages
    try:
        out = mnt / "run"
        with monkeypatch.context() as patch:
            if not real:
                _simulated_enospc(patch, out, after=2 + 3 * fill)
            capsys.readouterr()
            code = main(["train", str(config), "--out", str(out)])
            err = capsys.readouterr().err.strip().splitlines()
        if code == 0:
            pytest.skip(f"{'tmpfs' if real else 'the simulation'} did not fill at this size")
        assert code == 2 and len(err) == 1 and clean(err[0]) and str(mnt) in err[0], err
        assert "No space left on device" in err[0]
        if real:
            subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        assert main(["train", str(config), "--out", str(out), "--resume"]) == 0
        assert differences(run, out, 4) == []
    finally:
        if real:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_read_only_disk_is_one_line_and_nothing_is_lost(small: tuple[Path, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    run, config = small
    mnt = tmp_path / "mnt"
    if not _mount(mnt, "16m"):
        pytest.skip("cannot mount a tmpfs here (test_run_dir simulates the full disk)")
    try:
        shutil.copytree(run, mnt / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        longer = tmp_path / "longer.toml"
        longer.write_text(tomlio.dumps({**SMALL, "run": {**SMALL["run"], "max_updates": 6}}))
        code, err = resume(longer, mnt / "run", capsys)
        assert code == 2 and len(err) == 1 and "Read-only file system" in err[0] and clean(err[0]), err
        for _, path in ck.list_checkpoints(mnt / "run" / "checkpoints"):
            load_valid(path)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
