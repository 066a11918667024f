"""The JAX trainer on a GPU: GPT-2 small (configs/gpt2_small.toml) tokens/s and MFU, and the compiled
step against a bare optax loop. Called by bench/gpu_check.sh; safe to run anywhere.

    python bench/gpu_jax.py [--updates 30] [--skip 10] [--steps 10] [--repeats 3] [--config configs/gpt2_small.toml]
                            [--device cuda|cpu] [--set KEY=VALUE ...]

1. Trainer: `ref_jax.trainer.train` on the config (bfloat16 through the dtype Policy, TF32
   matmuls, AdamW, token-normalized accumulation of 4 × 8 × 1024 tokens), `--updates` updates, no
   checkpoint and no evaluation; prints the median tokens/s and MFU (metrics.jsonl, against the
   device's dense bf16 peak from conformance.run.throughput.PEAK_FLOPS) over the updates after `--skip`
   (the first include compilation).
2. Step: twinstep's jitted update against a bare optax loop on the same model and window
   (bench/jax_step.py's pair), wall clock, medians of `--repeats`.

Without a GPU visible to JAX (a CPU-only jaxlib, no driver) it prints SKIPPED and why, and exits 0,
so a GPU check script goes on with its other steps. `--device cpu` runs both parts on the CPU
(gpu_check.sh --smoke, with tiny sizes through --set). Exit 1 when a part fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]


def gpu_devices() -> tuple[list[Any], str]:
    """(JAX's GPUs, a reason when there are none)."""
    try:
        import jax
    except ImportError as exc:
        return [], f"jax is not importable ({exc})"
    try:
        found = jax.devices("gpu")
    except RuntimeError as exc:
        return [], f"JAX sees no GPU backend ({' '.join(str(exc).split())[:200]}); jax.devices() = {jax.devices()}"
    return list(found), ""


def trainer_throughput(config: Any, skip: int) -> dict[str, float]:
    from conformance.run.metrics import read_metrics, updates
    from ref_jax.trainer import train

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        train(config, Path(tmp) / "run", progress="lines")
        wall = time.perf_counter() - t0
        recs = updates(read_metrics(Path(tmp) / "run" / "metrics.jsonl"))
    kept = recs[skip:] or recs
    out = {"updates": len(recs), "wall_s": wall, "first_update_s": recs[0]["compute_time_s"],
           "median_update_s": statistics.median(r["data_time_s"] + r["compute_time_s"] for r in kept),
           "tokens_per_s": statistics.median(r.get("tokens_per_s", float("nan")) for r in kept),
           "last_loss": recs[-1]["loss"]}
    mfus = [r["mfu"] for r in kept if isinstance(r.get("mfu"), float)]
    if mfus:
        out["mfu"] = statistics.median(mfus)
    return out


def step_ratio(config: Any, steps: int, repeats: int) -> tuple[float, float]:
    import jax_step

    from ref_jax.precision import numerics_context

    jax_step.CLOCK = time.perf_counter  # asynchronous device work: only the wall clock sees it
    with numerics_context(config.precision):
        ours, bare = jax_step.step_pair(config)
        jax_step._time(ours, 2), jax_step._time(bare, 2)
        a, b = [], []
        for _ in range(repeats):
            a.append(jax_step._time(ours, steps))
            b.append(jax_step._time(bare, steps))
    return statistics.median(a), statistics.median(b)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "gpt2_small.toml"))
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--skip", type=int, default=10, help="updates left out of the medians (compilation)")
    p.add_argument("--steps", type=int, default=10, help="updates per timed sequence of the step comparison")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-step", action="store_true", help="skip the step comparison with bare optax")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    if args.skip >= args.updates:
        sys.exit(f"--skip {args.skip} leaves no update of --updates {args.updates} to time")
    gpus, why = gpu_devices() if args.device == "cuda" else ([], "")
    if args.device == "cuda" and not gpus:
        print(f"gpu_jax: SKIPPED: {why}")
        return 0
    import jax

    from conformance.config import load_config

    print(f"gpu_jax: jax {jax.__version__}, devices {[d.device_kind for d in gpus or jax.devices('cpu')]}", flush=True)
    overrides = [f"run.max_updates={args.updates}", "run.eval_every=0", "checkpoint.every=0", "checkpoint.at_end=false",
                 f'run.device="{args.device}"', 'run.progress="lines"', "run.log_every=10", *args.overrides]
    failed = False
    try:
        config = load_config(args.config, overrides)
        res = trainer_throughput(config, args.skip)
        mfu = f", MFU {100 * res['mfu']:.1f}%" if "mfu" in res else " (no MFU: device peak unknown)"
        print(f"gpu_jax: trainer {res['updates']} updates in {res['wall_s']:.1f}s (first update, with compilation, "
              f"{res['first_update_s']:.1f}s); median update {1e3 * res['median_update_s']:.1f} ms, "
              f"{res['tokens_per_s']:.0f} tokens/s{mfu}; last loss {res['last_loss']:.4f}", flush=True)
    except Exception:  # report and go on: this is a benchmark script, not a test
        failed = True
        print("gpu_jax: trainer FAILED\n" + traceback.format_exc(limit=6), flush=True)
    if not args.no_step:
        try:
            config = load_config(args.config, overrides)
            ours, bare = step_ratio(config, args.steps, args.repeats)
            print(f"gpu_jax: step twinstep {1e3 * ours:.1f} ms, bare optax {1e3 * bare:.1f} ms, "
                  f"ratio {ours / bare:.3f}", flush=True)
        except Exception:
            failed = True
            print("gpu_jax: step comparison FAILED\n" + traceback.format_exc(limit=6), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
