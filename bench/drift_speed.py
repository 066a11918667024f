"""Speed of `twinstep drift` against one training run of the same config, in the same session.

    python bench/drift_speed.py [--config configs/gpt_tiny.toml] [--updates 300] [--seeds 2] [--repeats 1]

Times, in fresh processes, `twinstep train CONFIG --backend torch` for --updates updates (the
baseline: one training run as a user starts it) and `twinstep drift CONFIG --updates N --seeds K`,
back to back, and prints each wall time and the ratio drift / train (goal for gpt_tiny float32,
300 updates, 2 seeds: <= 4). The fastest of --repeats is kept for each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):  # drift exits 1 outside the envelope: still timed
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "gpt_tiny.toml"))
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    cli = [sys.executable, "-m", "conformance"]
    train_s, drift_s = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            train_s.append(timed([*cli, "train", args.config, "--backend", "torch", "--out", f"{tmp}/train",
                                  "--set", f"run.max_updates={args.updates}", "--set", 'run.progress="none"']))
            drift_s.append(timed([*cli, "drift", args.config, "--updates", str(args.updates), "--seeds",
                                  str(args.seeds), "-o", f"{tmp}/drift"]))
    t, d = min(train_s), min(drift_s)
    print(f"train (torch, {args.updates} updates): {t:.1f} s")
    print(f"drift ({args.updates} updates, {args.seeds} seeds): {d:.1f} s")
    print(f"drift / train: {d / t:.2f} (goal: <= 4)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
