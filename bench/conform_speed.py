"""Speed and memory of `twinstep conform`, per backend, each in its own fresh process.

    python bench/conform_speed.py [--backends oracle,torch,jax,all] [--repeats 1] [-- EXTRA CONFORM ARGS]

Runs `python -m conformance conform --backend NAME` once per backend (repeated --repeats times,
fastest kept) and prints each process's wall seconds, CPU seconds (user + system, from wait4) and
peak resident set size (wait4's ru_maxrss), then the ratio JAX / torch of wall and CPU time: the
figure the suite-speed goal names (goal: ≤ 1.5; `all` ≤ 30 s wall and ≤ 1 GiB). Arguments after `--` go
to every run (e.g. `-- --jobs 1`). Every run must pass: a failed suite is reported, not timed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Measured(NamedTuple):
    wall_s: float
    cpu_s: float
    peak_rss_mib: float
    summary: str


def measure(backend: str, extra: list[str]) -> Measured:
    """One `twinstep conform --backend BACKEND` in a fresh interpreter."""
    cmd = [sys.executable, "-m", "conformance", "conform", "--backend", backend, "--failures", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"conform --backend {backend} exited {proc.returncode}:\n{out[-3000:]}")
    last = [ln for ln in out.splitlines() if ln.strip()][-1]
    # ru_maxrss is the largest of the process and its waited-for children (worker processes) in KiB
    return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, last)


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="oracle,torch,jax,all")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    got: dict[str, Measured] = {}
    print(f"{'backend':<8} {'wall s':>8} {'cpu s':>8} {'peak MiB':>9}  summary")
    for name in args.backends.split(","):
        got[name] = min((measure(name, extra) for _ in range(args.repeats)), key=lambda m: m.wall_s)
        m = got[name]
        print(f"{name:<8} {m.wall_s:8.2f} {m.cpu_s:8.2f} {m.peak_rss_mib:9.0f}  {m.summary}", flush=True)
    if "jax" in got and "torch" in got:
        j, t = got["jax"], got["torch"]
        print(f"jax / torch: wall {j.wall_s / t.wall_s:.2f}, cpu {j.cpu_s / t.cpu_s:.2f} (goal: <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
