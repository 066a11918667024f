"""Memory of training from token shards: the trainer's peak RSS on a >= 1 GiB shard against the same
run on a 10 MiB shard, measured side by side (each run in its own process).

    python bench/data_memory.py [--gib 1.0] [--updates 30] [--backend torch|jax] [--dir DIR]

Writes two llm.c shards of uniformly random tokens (vocabulary 512) into DIR (default: a temporary
directory, removed afterwards): `big` of --gib GiB and `small` of 10 MiB, then trains the same tiny
gpt on each with `twinstep train` (same config, updates, batch and seed; only data.path differs)
and reports each process's peak resident set size (wait4's ru_maxrss) and their difference. The
goal: within 64 MiB, i.e. the shard is memory-mapped and checked in chunks, never read
whole. The big run's start also shows the cost of checking and hashing every token once (the
`load s` column: wall seconds to the first metrics line).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.data.shards import ShardWriter  # noqa: E402

VOCAB = 512
CONFIG = """
[model]
name = "gpt"
n_layer = 2
n_head = 2
n_embd = 64
block_size = 64
vocab_size = {vocab}
[data]
name = "tokens"
path = "{path}"
batch_size = 8
[optimizer]
name = "adamw"
lr = 1e-3
[checkpoint]
at_end = false
[run]
max_updates = {updates}
eval_every = 0
device = "cpu"
"""


def write_shard(path: Path, n_tokens: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    with ShardWriter(path) as w:
        done = 0
        while done < n_tokens:
            n = min(1 << 24, n_tokens - done)
            w.write(rng.integers(0, VOCAB, n, dtype=np.uint16))
            done += n
    return path


def train(shard: Path, work: Path, name: str, updates: int, backend: str) -> tuple[int, float, float]:
    """(peak RSS bytes, seconds to the first metrics line, total seconds) of one training process."""
    config = work / f"{name}.toml"
    config.write_text(CONFIG.format(vocab=VOCAB, path=shard, updates=updates))
    out = work / f"run-{name}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "conformance", "train", str(config), "--backend", backend,
                             "--out", str(out), "--progress", "none"], env=env, stderr=subprocess.PIPE)
    first = None
    while True:  # reap the child ourselves: wait4 gives its own peak RSS
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if first is None and (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size:
            first = time.monotonic() - start
        time.sleep(0.01)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{name} run failed: {proc.stderr.read().decode()[-2000:]}")
    return int(usage.ru_maxrss) * 1024, first or float("nan"), time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="size of the big shard in GiB (default 1)")
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--backend", default="torch", choices=("torch", "jax"))
    ap.add_argument("--dir", default=None, help="where to write the shards (default: a temporary directory)")
    args = ap.parse_args()
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="twinstep-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        big = write_shard(work / "big.bin", int(args.gib * (1 << 30)) // 2, seed=1)
        small = write_shard(work / "small.bin", (10 << 20) // 2, seed=2)
        rows = {}
        for name, shard in (("small", small), ("big", big)):
            rows[name] = train(shard, work, name, args.updates, args.backend)
        print(f"{args.backend}, {args.updates} updates of 8 x 64 tokens, gpt 2 x 64, vocabulary {VOCAB}")
        print(f"{'shard':<6} {'size':>10} {'peak RSS MiB':>13} {'load s':>7} {'total s':>8}")
        for name, shard in (("small", small), ("big", big)):
            rss, first, total = rows[name]
            print(f"{name:<6} {shard.stat().st_size / (1 << 20):>8.0f}Mi {rss / (1 << 20):>13.1f} {first:>7.1f} {total:>8.1f}")
        diff = (rows["big"][0] - rows["small"][0]) / (1 << 20)
        verdict = "within" if diff <= 64 else "beyond"
        print(f"big - small: {diff:+.1f} MiB ({verdict} the 64 MiB goal); ratio {rows['big'][0] / rows['small'][0]:.3f}")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
