"""Waiting on a started process without hanging: a wait that runs out fails the test naming the
process, what it was waiting for and the end of the process's stderr."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest

# seconds a train process may take to write its first metrics line: measured idle on 2 cores, the
# default config takes 2.7 s (torch) and 2.6 s (JAX) from start to its first line (imports, data,
# the first compiled step), the tests' gpt configs a few seconds more; a suite with both cores
# busy ran ~1.7x slower, so 120 s leaves over x5 of the worst of these on a loaded machine
FIRST_METRICS_S = 120.0


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float = FIRST_METRICS_S,
               poll: float = 0.01) -> bool:
    """Poll `ready()` until it holds (True) or the process ends (False: the caller decides whether
    that is a failure); after `timeout` seconds, kill the process and fail naming it and `what`."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if ready():
            return True
        if time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            tail = err.decode(errors="replace") if isinstance(err, bytes) else (err or "")
            pytest.fail(f"process {proc.pid} ({' '.join(map(str, proc.args))}) did not {what} within "
                        f"{timeout:.0f} s; its stderr ends: {tail[-1500:]}")
        time.sleep(poll)
    return ready()
