"""Owned run directories and clean OS errors (conformance/run/rundir.py, run/metrics.py).

- One run at a time: a second run into a busy --out is refused at once naming the holder's pid, and
  the first run's checkpoints verify; the lock goes with its holder.
- Nothing of the user's is overwritten: a fresh run refuses an --out holding files no twinstep run
  wrote (config.toml, metrics.jsonl, anything), byte for byte unchanged afterwards.
- Temp files of every kind are removed at the start; links and FIFOs where a run's file belongs are
  refused (checkpoints/ as a link out of the run included).
- Every OSError on the user's paths is one line naming the path and the cause, exit 2: --out is a
  file, checkpoints is a file, metrics.jsonl is a directory, a read-only or full file system (a
  real small tmpfs where this machine lets us mount one; otherwise, and always in addition, a
  simulated ENOSPC: os.write patched in-process to fail, labelled so).
- Metrics lines are written whole (one write per line) so a killed or full-disk run leaves no line
  the next run cannot read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conformance import checkpoint as ck
from conformance.cli import main
from conformance.run import metrics as metrics_module
from conformance.run.metrics import read_metrics, updates
from conformance.run.rundir import LOCK, claim

SMALL = ["--set", "run.max_updates=6", "--set", "checkpoint.every=2", "--progress", "none"]


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def train(out: Path, *extra: str, backend: str = "torch") -> int:
    return main(["train", "--backend", backend, "--out", str(out), *SMALL, *extra])


def one_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("twinstep: error: "), err
    assert "Traceback" not in err[0] and "internal error" not in err[0]
    return err[0]


def digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and p.name != LOCK}


# --- one run at a time -------------------------------------------------------------------------


def test_a_second_run_into_a_busy_directory_is_refused_naming_the_holder(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    before = digest(out)
    holder = subprocess.Popen(["sleep", "60"])  # stands in for the first run: it holds the lock
    try:
        owner = claim(out, resume=True)
        os.ftruncate(owner._fd, 0)  # a shorter pid must not leave the end of a longer one behind
        os.pwrite(owner._fd, f"{holder.pid}\n".encode(), 0)
        capsys.readouterr()
        assert train(out, "--resume") == 2
        line = one_error(capsys)
        assert f"{out} is in use by another twinstep run (pid {holder.pid})" in line
        owner.release()
    finally:
        holder.kill()
    assert digest(out) == before  # nothing touched; the first run's checkpoints verify
    for _, path in ck.list_checkpoints(out / "checkpoints"):
        ck.verify_checkpoint(path)
    assert train(out, "--resume") == 0  # released: the directory is usable again


def test_negative_control_without_the_lock_both_would_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.run import rundir

    out = tmp_path / "run"
    owner = claim(out, resume=False)
    monkeypatch.setattr(rundir.fcntl, "flock", lambda fd, op: None)  # a run directory nobody locks
    second = claim(out, resume=False)  # what the test above catches: no refusal
    second.release()
    owner.release()


# --- nothing of the user's is overwritten ------------------------------------------------------


@pytest.mark.parametrize("name", ["config.toml", "metrics.jsonl", "notes.txt"])
def test_a_fresh_run_never_overwrites_a_users_file(tmp_path: Path, capsys: pytest.CaptureFixture, name: str) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("the user's own\n")
    before = digest(out)
    capsys.readouterr()
    assert train(out) == 2
    assert f"already holds '{name}', which no twinstep run wrote there" in one_error(capsys)
    assert digest(out) == before and sorted(os.listdir(out)) == [name]


def test_a_run_directory_of_twinstep_restarts_and_an_empty_one_is_taken(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    assert train(out, "--set", "checkpoint.every=0", "--set", "checkpoint.at_end=false") == 0
    assert (out / LOCK).is_file() and train(out, "--set", "checkpoint.every=0", "--set", "checkpoint.at_end=false") == 0


# --- temp files, links, FIFOs ------------------------------------------------------------------


def test_temp_files_of_every_kind_are_removed_at_the_start(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    leftovers = [out / ".config.toml.a1B2c3D4", out / ".config.toml.tmp-0123abcd", out / ".metrics.jsonl.tmp-89abcdef",
                 out / "metrics.jsonl.tmp", out / "checkpoints" / ".tmp-step-00000008-deadbeef"]
    for path in leftovers:
        path.write_text("half")
    assert train(out, "--resume", "--set", "run.max_updates=8") == 0
    assert not any(p.exists() for p in leftovers)


@pytest.mark.parametrize("where", ["checkpoints", "config.toml", "metrics.jsonl", LOCK])
def test_a_link_where_a_runs_file_belongs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     where: str) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    outside = tmp_path / "outside"
    os.replace(out / where, outside)
    (out / where).symlink_to(outside)
    before = digest(outside) if outside.is_dir() else outside.read_bytes()
    capsys.readouterr()
    assert train(out, "--resume", "--set", "run.max_updates=8") == 2
    assert f"{out / where} is a symbolic link" in one_error(capsys)
    assert (digest(outside) if outside.is_dir() else outside.read_bytes()) == before


def test_a_fifo_where_metrics_belong_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    (out / "metrics.jsonl").unlink()
    os.mkfifo(out / "metrics.jsonl")
    capsys.readouterr()
    assert train(out, "--resume", "--set", "run.max_updates=8") == 2
    assert "metrics.jsonl is a FIFO (named pipe)" in one_error(capsys)


# --- OS errors: one line naming the path and the cause -----------------------------------------


def test_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "f").write_text("x")
    assert train(tmp_path / "f") == 2
    assert f"--out {tmp_path / 'f'} is a regular file, not a directory" in one_error(capsys)
    assert train(tmp_path / "f" / "sub") == 2
    assert "cannot create the output directory (Not a directory" in one_error(capsys)


def test_checkpoints_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).write_text("")
    (out / "checkpoints").write_text("x")
    assert train(out) == 2
    assert f"{out / 'checkpoints'} is a regular file; twinstep needs a directory there" in one_error(capsys)


def test_metrics_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert train(out) == 0
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").mkdir()
    capsys.readouterr()
    assert train(out, "--resume", "--set", "run.max_updates=8") == 2
    assert f"{out / 'metrics.jsonl'} is a directory; twinstep needs a file there" in one_error(capsys)


def _is_metrics(fd: int) -> bool:
    return os.readlink(f"/proc/self/fd/{fd}").endswith("/metrics.jsonl")


def _full_disk_from_update(u: int, monkeypatch: pytest.MonkeyPatch, torn: bool = True) -> None:
    """SIMULATED full disk (labelled: no file system is filled): the write to metrics.jsonl that holds
    update u's line and every later write to it fail with ENOSPC (whatever the batching of lines);
    with `torn` the failing write stops inside that line, as a write that runs out of space part-way does."""
    real = os.write
    failing = [False]
    mark = f'"update": {u},'.encode()

    def write(fd: int, data: bytes) -> int:
        if not _is_metrics(fd):
            return real(fd, data)
        if failing[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if mark in data:
            failing[0] = True
            if torn:  # out of space inside update u's line
                return real(fd, data[: data.index(mark) + len(mark)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(metrics_module.os, "write", write)


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_simulated_full_disk_while_writing_metrics_is_one_line_and_resumable(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        _full_disk_from_update(2, patch)  # written at the latest before the checkpoint at 4
        assert train(out, backend=backend) == 2
    line = one_error(capsys)
    assert f"{out / 'metrics.jsonl'}: cannot write (No space left on device)" in line
    data = (out / "metrics.jsonl").read_bytes()
    whole, torn = data[:data.rfind(b"\n") + 1], data[data.rfind(b"\n") + 1:]
    assert torn and all(json.loads(x) for x in whole.splitlines())  # whole lines, then the torn write's half
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")] == [2]
    assert train(out, "--resume", backend=backend) == 0  # the next run reads the file and cuts it back
    assert [r["update"] for r in updates(read_metrics(out / "metrics.jsonl"))] == list(range(6))


def test_each_metrics_write_is_whole_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real, writes = os.write, []

    def write(fd: int, data: bytes) -> int:
        if _is_metrics(fd):
            writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(metrics_module.os, "write", write)
    assert train(tmp_path / "run") == 0
    data = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    assert b"".join(writes) == data and all(w.endswith(b"\n") for w in writes)  # no write ends mid-line
    assert len(writes) < data.count(b"\n")  # update lines go out in batches (flushed at each checkpoint)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Any:
    """A real 1 MiB tmpfs, where this machine allows mounting (root with CAP_SYS_ADMIN); else skip."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (the simulated full disk above still runs)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_real_full_disk_is_one_line_naming_the_path(tmpfs: Path, capsys: pytest.CaptureFixture) -> None:
    ballast = tmpfs / "ballast"
    with pytest.raises(OSError):
        ballast.write_bytes(b"\0" * (2 << 20))  # fill it: the write stops at ENOSPC
    assert train(tmpfs / "run") == 2
    line = one_error(capsys)
    assert str(tmpfs / "run") in line and "No space left on device" in line


def test_a_read_only_output_is_one_line_naming_the_path(tmpfs: Path, capsys: pytest.CaptureFixture) -> None:
    assert train(tmpfs / "run") == 0
    before = digest(tmpfs / "run")
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    capsys.readouterr()
    assert train(tmpfs / "run", "--resume", "--set", "run.max_updates=8") == 2
    line = one_error(capsys)
    assert str(tmpfs / "run") in line and "Read-only file system" in line
    assert digest(tmpfs / "run") == before
