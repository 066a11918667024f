"""The tests' wait on a started process (tests/support/processes.py, issue 36 item 3): it returns as
soon as the awaited thing holds or the process has ended, and a wait that runs out fails naming
the process, what it waited for and its stderr, and leaves no process behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.processes import wait_until

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
