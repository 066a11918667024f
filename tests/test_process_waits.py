"""The tests' waits on a started process (tests/support/processes.py): each returns as
soon as the awaited thing holds or the process has ended, and a wait that runs out fails naming
the process, what it waited for and its stderr, and leaves no process behind (nor, for a process
leading its own group, what it started)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.processes import run_process, wait_for, wait_until

SLEEPER = "import sys, time; sys.stderr.write('still loading'); sys.stderr.flush(); time.sleep(60)"


def test_a_wait_that_runs_out_names_the_process_and_what_it_waited_for() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER], stderr=subprocess.PIPE)
    with pytest.raises(pytest.fail.Exception) as exc:
        wait_until(proc, lambda: False, "write a line to run/metrics.jsonl", timeout=1.0)
    message = str(exc.value)
    assert f"process {proc.pid} ({sys.executable} -c import sys" in message
    assert "did not write a line to run/metrics.jsonl within 1 s; its stderr ends: still loading" in message
    assert proc.returncode is not None  # killed and reaped, not left running


def test_a_wait_returns_when_the_thing_holds_or_the_process_ends(tmp_path: Path) -> None:
    flag = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(flag)!r}).touch(); "
                                                   "time.sleep(60)"])
    try:
        assert wait_until(proc, flag.exists, "create the flag", timeout=60) is True
    finally:
        proc.kill()
        proc.wait()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until(ended, lambda: False, "never", timeout=60) is False  # ended: the caller decides


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a killed process waiting to be reaped is gone


def test_a_finish_that_runs_out_kills_the_process_and_what_it_started(tmp_path: Path) -> None:
    child = tmp_path / "child"
    code = ("import pathlib, subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"pathlib.Path({str(child)!r}).write_text(str(c.pid)); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, start_new_session=True)
    assert wait_until(proc, lambda: child.exists() and child.read_text() != "", "start its child", timeout=60)
    grandchild = int(child.read_text())
    with pytest.raises(pytest.fail.Exception, match=r"did not finish training within 1 s"):
        wait_for(proc, "finish training", timeout=1.0)
    assert proc.returncode is not None
    deadline = time.monotonic() + 30
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)  # torchrun's workers go with torchrun


def test_a_run_that_runs_out_fails_naming_it_and_one_that_ends_returns_its_result() -> None:
    with pytest.raises(pytest.fail.Exception) as exc:
        run_process([sys.executable, "-c", SLEEPER], "print the sharding", 1.0, capture_output=True)
    assert "did not print the sharding within 1 s; its stderr ends: still loading" in str(exc.value)
    done = run_process([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], "exit", 60,
                       capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, "out\n")  # the negative control: no failure, the result
    with pytest.raises(subprocess.CalledProcessError):
        run_process([sys.executable, "-c", "import sys; sys.exit(3)"], "exit", 60, check=True)
    fed = run_process([sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"], "echo", 60,
                      input="abc", capture_output=True, text=True)
    assert fed.stdout == "cba\n"
