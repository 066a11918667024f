"""JAX train step cost: twinstep's compiled step against a bare optax loop, and JAX beside torch.

    python bench/jax_step.py [--models mlp,gpt] [--steps 30] [--repeats 5] [--updates 60] [--device cpu|cuda]
                             [--dtype float32|bfloat16] [--no-torch]

1. Step: the JAX trainer's one jitted update (ref_jax._train_step: schedule table, padded window
   scanned with masks, loss scaling and finite checks, clipping, twinstep's AdamW with per-group
   hyper-parameters, donated state) against a bare optax loop on the same Flax model, window and
   hyper-parameters: jax.grad scanned over the micro-batches, optax.clip_by_global_norm and
   optax.adamw under inject_hyperparams, also jitted and donated. Both are called `--steps` times
   back to back and synchronized once; repeats alternate the two and report medians of the
   process's CPU time (all XLA threads; other jobs on a shared machine do not inflate it; --wall
   for the wall clock, always used on CUDA). The ratio
   twinstep / bare is the cost of twinstep's plumbing (goal ≈ 1).
2. Trainers: `ref_torch.trainer.train` and `ref_jax.trainer.train` on the same config for
   `--updates` updates, each in a fresh process (so neither framework's thread pool competes with
   the other's); the median per-update time (data_time_s + compute_time_s of metrics.jsonl, the
   first 5 updates left out: they include compilation) side by side.

Nothing here is a test: timings and ratios measured in the same run are printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from conformance.config import load_config  # noqa: E402

COMMON = {"optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 1e-2}, "clip": {"max_norm": 1.0},
          "accumulation": {"steps": 2}, "checkpoint": {"at_end": False}}
MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"model": {"name": "mlp", "hidden": [64]}, "data": {"name": "binary_blobs", "batch_size": 64}},
    "gpt": {"model": {"name": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
            "data": {"name": "text", "batch_size": 8}},
}


def make_config(name: str, updates: int, device: str, dtype: str) -> Any:
    return load_config({**MODELS[name], **COMMON, "schedule": {"name": "cosine", "t_max": updates, "eta_min": 1e-5},
                        "precision": {"dtype": dtype},
                        "run": {"max_updates": updates, "eval_every": 0, "device": device, "progress": "none"}})


CLOCK = time.process_time  # CPU time of the process (all XLA threads): robust on a shared machine; --wall


def _time(fn: Callable[[], Any], steps: int) -> float:
    import jax

    out = None
    t0 = CLOCK()
    for _ in range(steps):
        out = fn()
    jax.block_until_ready(out)
    return (CLOCK() - t0) / steps


def step_pair(config: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(twinstep step, bare optax step), each a no-argument call running one update in place."""
    import jax
    import jax.numpy as jnp
    import optax

    from conformance.data import DataPipeline
    from conformance.run.batches import window_counts
    from conformance.run.counters import Counters
    from ref_jax import _train_state as ts
    from ref_jax._parallel import placement
    from ref_jax._train_step import make_train_step

    data = DataPipeline(config)
    place = placement(config.run.device)
    parts = ts.build(config, data.info, place, data.updates_per_epoch, data.planned_updates)
    run = types.SimpleNamespace(config=config, counters=Counters(), checkpoint=None)
    state, key = ts.initial_state(parts, run, place)
    window = data.window(0)
    arrays = place.put_batch(parts.layout.pad(window, window_counts(config, window)), axis=1)
    tables = place.put_replicated(parts.tables)
    step = make_train_step(config, parts.apply, parts.policy, parts.tx, parts.layout, place)
    ours = {"state": state}

    def twinstep() -> Any:
        ours["state"], out = step(ours["state"], arrays, np.int32(0), tables, key)
        return out.info.loss

    # the bare loop: the same model function, window and hyper-parameters, in plain optax
    apply, policy, tokens = parts.apply, parts.policy, parts.layout.tokens
    tx = optax.chain(optax.clip_by_global_norm(config.clip.max_norm),
                     optax.inject_hyperparams(optax.adamw)(learning_rate=config.optimizer.lr,
                                                           weight_decay=config.optimizer.weight_decay))
    params = place.put_replicated(jax.tree.map(np.asarray, ts.params_numpy(state)))
    xs, ys = arrays["data"]["x"], arrays["data"]["y"]
    lrs = jnp.asarray(parts.tables["lr"][:, 0])

    def loss(p: Any, x: Any, y: Any) -> Any:
        logits = policy.cast_to_output(apply(p, None, x, None, True)[0])  # the same model function (autocast for half dtypes)
        if tokens:
            logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def bare_update(p: Any, s: Any, count: Any) -> tuple[Any, Any, Any]:
        def body(acc: Any, xy: Any) -> tuple[Any, Any]:
            value, g = jax.value_and_grad(loss)(p, *xy)
            return (jax.tree.map(lambda a, b: a + b / xs.shape[0], acc[0], g), acc[1] + value / xs.shape[0]), None

        (grads, value), _ = jax.lax.scan(body, (jax.tree.map(jnp.zeros_like, p), jnp.zeros(())), (xs, ys))
        s[1].hyperparams["learning_rate"] = lrs[count]
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    bare_step = jax.jit(bare_update, donate_argnums=(0, 1))
    # the state placed as the step's outputs will be (committed, replicated): else a second compile
    theirs = {"p": params, "s": place.put_replicated(tx.init(params))}

    def bare() -> Any:
        theirs["p"], theirs["s"], value = bare_step(theirs["p"], theirs["s"], 0)
        return value

    return twinstep, bare


def bench_steps(name: str, args: argparse.Namespace) -> tuple[float, float]:
    from ref_jax.precision import numerics_context

    config = make_config(name, max(args.updates, 10), args.device, args.dtype)
    with numerics_context(config.precision):
        ours, bare = step_pair(config)
        _time(ours, 2), _time(bare, 2)  # compile both
        a, b = [], []
        for _ in range(args.repeats):
            a.append(_time(ours, args.steps))
            b.append(_time(bare, args.steps))
    return statistics.median(a), statistics.median(b)


def trainer_step_time(backend: str, config: Any) -> float:
    from conformance.run.metrics import read_metrics, updates

    if backend == "torch":
        from ref_torch.trainer import train
    else:
        from ref_jax.trainer import train
    with tempfile.TemporaryDirectory() as tmp:
        train(config, Path(tmp) / "run")
        recs = updates(read_metrics(Path(tmp) / "run" / "metrics.jsonl"))[5:]
    return statistics.median(r["data_time_s"] + r["compute_time_s"] for r in recs)


def _in_subprocess(backend: str, name: str, args: argparse.Namespace) -> float:
    cmd = [sys.executable, __file__, "--trainer", backend, name, "--updates", str(args.updates), "--device",
           args.device, "--dtype", args.dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,gpt")
    p.add_argument("--steps", type=int, default=30, help="updates per timed call sequence")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--updates", type=int, default=60, help="updates of each trainer run")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--no-torch", action="store_true", help="skip the trainer comparison with torch")
    p.add_argument("--wall", action="store_true", help="time steps by the wall clock (default: process CPU time)")
    p.add_argument("--trainer", nargs=2, metavar=("BACKEND", "MODEL"), help=argparse.SUPPRESS)  # one subprocess
    args = p.parse_args()
    if args.trainer:
        backend, name = args.trainer
        print(trainer_step_time(backend, make_config(name, args.updates, args.device, args.dtype)))
        return 0
    global CLOCK
    if args.wall or args.device == "cuda":
        CLOCK = time.perf_counter
    names = [n for n in args.models.split(",") if n]
    print(f"JAX step, {args.device}, {args.dtype}: twinstep's compiled update vs a bare optax loop "
          f"(median of {args.repeats} x {args.steps} updates)")
    print(f"{'model':<6} {'twinstep ms':>12} {'bare optax ms':>14} {'ratio':>7}")
    for name in names:
        ours, bare = bench_steps(name, args)
        print(f"{name:<6} {ours * 1e3:12.3f} {bare * 1e3:14.3f} {ours / bare:7.3f}", flush=True)
    if args.no_torch:
        return 0
    print(f"\ntrainers, {args.updates} updates: median per-update time (data + compute) from metrics.jsonl")
    print(f"{'model':<6} {'torch ms':>10} {'jax ms':>10} {'jax/torch':>10}")
    for name in names:
        t, j = (_in_subprocess(backend, name, args) for backend in ("torch", "jax"))
        print(f"{name:<6} {t * 1e3:10.3f} {j * 1e3:10.3f} {j / t:10.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
