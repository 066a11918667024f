"""Waiting on a started process without hanging: a wait that runs out kills the process (and what
it started) and fails the test naming the process, what it was waiting for and the end of its
stderr.

Timeouts are sized from measured runs: every process the tests start took at most 14 s on the
2-vCPU machine (the four-rank resume 10.5 s, a JAX kill-and-resume run 13.8 s; CLI refusals and
snippets under 6.3 s), and a suite with both cores kept busy ran ~1.7x slower: PROCESS_S = 120 s
is x5 of the slowest on a loaded machine."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

# seconds a train process may take to write its first metrics line: measured idle on 2 cores, the
# default config takes 2.7 s (torch) and 2.6 s (JAX) from start to its first line (imports, data,
# the first compiled step), the tests' gpt configs a few seconds more; 120 s is over x5 of the
# worst of these on a loaded machine
FIRST_METRICS_S = 120.0
# seconds any one process the tests start may take to finish (see the module docstring)
PROCESS_S = 120.0


def _describe(args: Any) -> str:
    return args if isinstance(args, str) else " ".join(map(str, args))


def _tail(err: bytes | str | None) -> str:
    text = err.decode(errors="replace") if isinstance(err, bytes) else (err or "")
    return text[-1500:]


def _kill(proc: subprocess.Popen) -> str:
    """Kill the process, its process group too when it leads one (torchrun's workers), and reap it;
    the end of its stderr when the caller piped it."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.kill()
    _, err = proc.communicate()
    return _tail(err)


def _fail(proc: subprocess.Popen, what: str, timeout: float, tail: str) -> None:
    pytest.fail(f"process {proc.pid} ({_describe(proc.args)}) did not {what} within {timeout:.0f} s; "
                f"its stderr ends: {tail}")


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float = FIRST_METRICS_S,
               poll: float = 0.01) -> bool:
    """Poll `ready()` until it holds (True) or the process ends (False: the caller decides whether
    that is a failure); after `timeout` seconds, kill the process and fail naming it and `what`."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if ready():
            return True
        if time.monotonic() > deadline:
            _fail(proc, what, timeout, _kill(proc))
        time.sleep(poll)
    return ready()


def wait_for(proc: subprocess.Popen, what: str, timeout: float) -> tuple[Any, Any]:
    """`proc.communicate()` within `timeout` seconds: its (stdout, stderr); past it, kill the process
    and fail naming it and `what`."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _fail(proc, what, timeout, _kill(proc))
        raise  # unreachable: pytest.fail raised


def run_process(cmd: Sequence[Any], what: str, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, **kwargs)` within `timeout` seconds, in a session of its own so that a
    timeout kills what it started as well; past it, fail naming the process and `what`."""
    check = kwargs.pop("check", False)
    stdin = kwargs.pop("input", None)
    if stdin is not None:
        kwargs["stdin"] = subprocess.PIPE
    if kwargs.pop("capture_output", False):
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(cmd, start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            _fail(proc, what, timeout, _kill(proc))
            raise  # unreachable: pytest.fail raised
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def child_env() -> dict[str, str]:
    """The environment of a twinstep process a test starts: this one's without TWINSTEP_* and
    XLA_FLAGS (a test's own settings must not leak into it), one intra-op thread (as the in-process
    runs it is compared with: tests/support/trainers.py one_thread), the repository importable."""
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "XLA_FLAGS"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

