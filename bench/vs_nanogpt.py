"""nanoGPT's own train.py against twinstep's torch and JAX trainers on its CPU Shakespeare recipe, in
one run on this machine (docs/recipes.md, docs/performance.md).

    python bench/vs_nanogpt.py --nanogpt PATH_TO_A_NANOGPT_CHECKOUT [--updates 2000] [--threads 1]

The checkout is copied to a temporary directory (yours is not touched); its
data/shakespeare_char/input.txt is written from twinstep's built-in corpus (the same text
prepare.py downloads) and prepare.py makes the token files. Then, each in a fresh process with
--threads intra-op threads:

- nanoGPT: `train.py config/train_shakespeare_char.py` with its README's CPU flags (--device=cpu
  --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4
  --n_head=4 --n_embd=128 --lr_decay_iters=2000 --dropout=0.0) and --max_iters=UPDATES;
- twinstep torch and JAX: `twinstep train configs/shakespeare_char_cpu.toml --set
  run.max_updates=UPDATES` (the schedule still decays to 2000, as nanoGPT's lr_decay_iters).

Printed per contender: the val loss after UPDATES updates (nanoGPT's "step N" estimate over 20
random batches; twinstep's over its 20 fixed batches: docs/recipes.md says how they differ), the
median time per update (nanoGPT's "iter" lines; twinstep's data + compute time per metrics line),
the process's wall seconds, and twinstep / nanoGPT ratios. UPDATES must be a multiple of 250 (both
evaluate every 250). Goals: val loss within 0.03 of nanoGPT's, time per update <= 1.0x.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.data import builtin_corpus  # noqa: E402
from conformance.run.metrics import evals, read_metrics, updates  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
README_CPU = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
              "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--lr_decay_iters=2000",
              "--dropout=0.0"]


def run(cmd: list[str], cwd: Path, threads: int) -> tuple[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"{' '.join(cmd[:3])} ... failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr, wall


def nanogpt(checkout: Path, work: Path, n: int, threads: int) -> dict[str, float]:
    repo = work / "nanoGPT"
    shutil.copytree(checkout, repo, ignore=shutil.ignore_patterns(".git", "out*"))
    data = repo / "data" / "shakespeare_char"
    (data / "input.txt").write_text(builtin_corpus("tinyshakespeare"), encoding="utf-8")
    run([sys.executable, "prepare.py"], data, threads)
    out, wall = run([sys.executable, "train.py", "config/train_shakespeare_char.py", *README_CPU,
                     f"--max_iters={n}", f"--out_dir={work / 'out'}"], repo, threads)
    evals_ = {int(m[1]): float(m[2]) for m in re.finditer(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", out)}
    times = [float(t) for t in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", out)[5:]]
    if n not in evals_:
        sys.exit(f"nanoGPT printed no val loss at step {n}:\n{out[-2000:]}")
    return {"val_loss": evals_[n], "update_s": statistics.median(times) / 1e3, "wall_s": wall}


def twinstep(backend: str, work: Path, n: int, threads: int) -> dict[str, float]:
    out = work / f"twinstep-{backend}"
    _, wall = run([sys.executable, "-m", "conformance", "train", str(ROOT / "configs" / "shakespeare_char_cpu.toml"),
                   "--backend", backend, "--out", str(out), "--progress", "none", "--set", f"run.max_updates={n}",
                   "--set", "checkpoint.every=0", "--set", "checkpoint.at_end=false"], ROOT, threads)
    records = read_metrics(out / "metrics.jsonl")
    times = [r["data_time_s"] + r["compute_time_s"] for r in updates(records)[5:]]
    return {"val_loss": evals(records)[-1]["val_loss"], "update_s": statistics.median(times), "wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", required=True, type=Path, help="a checkout of github.com/karpathy/nanoGPT")
    p.add_argument("--updates", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of each process (default 1)")
    args = p.parse_args()
    if not (args.nanogpt / "train.py").is_file():
        sys.exit(f"--nanogpt {args.nanogpt}: no train.py there; give a nanoGPT checkout")
    if args.updates % 250:
        sys.exit(f"--updates {args.updates}: must be a multiple of 250 (both evaluate every 250 updates)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results["nanoGPT"] = nanogpt(args.nanogpt.resolve(), work, args.updates, args.threads)
        for backend in ("torch", "jax"):
            results[f"twinstep {backend}"] = twinstep(backend, work, args.updates, args.threads)
    base = results["nanoGPT"]
    print(f"vs_nanogpt: {args.updates} updates of the CPU recipe, {args.threads} intra-op thread(s) per process")
    for name, r in results.items():
        rel = "" if name == "nanoGPT" else (f"; val loss {r['val_loss'] - base['val_loss']:+.4f} vs nanoGPT, "
                                            f"time per update {r['update_s'] / base['update_s']:.3f}x")
        print(f"vs_nanogpt: {name}: val loss {r['val_loss']:.4f}, median update {1e3 * r['update_s']:.1f} ms, "
              f"wall {r['wall_s']:.0f} s{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
