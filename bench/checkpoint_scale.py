"""Checkpoint save time and rank 0's peak host memory for 1, 2 and 4 ranks (FSDP2 on the CPU, gloo).

    python bench/checkpoint_scale.py [--ranks 1,2,4] [--layers 8] [--width 768] [--repeats 2]

A gpt of ≥ 50 M parameters (8 layers of width 768: 56.7 M, float32) with AdamW state (m, v) after
one step, built by the trainer's own parts (conformance.run.session.open_run, ref_torch._model,
_parallel.wrap, build_optimizer), saved by the trainer's save (ref_torch._train_state.save_checkpoint):

- `sharded`: what FSDP2 runs write now (format 3): every rank writes its own rows, nothing gathered;
- `gather` (the baseline, in the same run): what they wrote before sharded saves, every parameter and
  optimizer state gathered to whole tensors (`full_tensor()`) and rank 0 writing the whole layout;
- one rank: the whole layout (both are the same there).

Memory is rank 0's Linux peak RSS (VmHWM), reset right before the save (/proc/self/clear_refs) and
read right after it, minus the process's RSS before the model was built (the libraries; glibc's
mmap threshold fixed with MALLOC_MMAP_THRESHOLD_ so freed blocks leave the RSS): what the
model, its optimizer state and the save hold at the save's peak. The ratio divides it by the full
state (parameters + m + v), so under FSDP it should fall as ~1/N (the rank's resident shard; the save
itself streams the shard to its file) while the gather baseline stays above 1. Times: wall clock
of the save (all ranks, barrier to barrier), median of --repeats. No absolute number is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
MARK = "CHECKPOINT_SCALE "


def rss_bytes(field: str) -> int:
    """VmRSS / VmHWM of this process (bytes)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Set VmHWM to the current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from conformance.config import load_config
    from conformance.run.loop import resolve_world
    from conformance.run.session import open_run
    from ref_torch import _fsdp, _model, _train_state
    from ref_torch import _parallel as ddp
    from ref_torch._arrays import native_numpy
    from ref_torch.optimizers import build_optimizer
    from ref_torch.precision import LossScaler

    rank, world, local = resolve_world(None, None)
    device = torch.device("cpu")
    created = ddp.setup(rank, world, device)
    torch.manual_seed(0)
    base = rss_bytes("VmRSS")
    config = load_config({
        "model": {"name": "gpt", "n_layer": args.layers, "n_head": 12, "n_embd": args.width, "block_size": 64},
        "data": {"name": "text", "path": args.corpus, "batch_size": 1},
        "optimizer": {"name": "adamw", "lr": 1e-4},
        "checkpoint": {"keep_last": 100},
        "run": {"max_updates": 10, "device": "cpu", "parallel": "fsdp", "seed": 0},
    })
    run = open_run(config, Path(args.out), "torch", rank=rank, world_size=world, progress="none", metrics=False)
    model = _model.make(config, run.data.info, device)
    ddp.wrap(model, device, world, "fsdp")
    tensors = _model.named(model, config.model.rename)
    optimizer = build_optimizer(config.optimizer, tensors.params.items())
    for p in tensors.params.values():
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()  # AdamW's m and v exist now
    optimizer.zero_grad(set_to_none=True)
    objs = _train_state.Objects(model, optimizer, LossScaler(config.precision, device), tensors)
    n_params = sum(p.numel() for p in tensors.params.values())
    full_state = sum(p.numel() * p.element_size() * 3 for p in tensors.params.values())

    def gather_save(update: int) -> None:  # the pre-issue-15 path: whole tensors to rank 0
        weights = {n: native_numpy(_fsdp.full(t.detach())) for n, t in tensors.all().items()}
        opt = {}
        for name, p in tensors.params.items():
            st = optimizer.state[p]
            opt[name] = {"m": native_numpy(_fsdp.full(st["exp_avg"])), "v": native_numpy(_fsdp.full(st["exp_avg_sq"])),
                         "step": native_numpy(st["step"]).astype("int64").reshape(())}
        if rank == 0:
            from conformance.checkpoint import TrainingState, save_checkpoint

            save_checkpoint(Path(args.out) / "gather", TrainingState(update, weights, opt, {}, {}, ""))
        del weights, opt

    results = []
    update = 1
    for layout in (["sharded", "gather"] if world > 1 else ["whole"]):
        for _ in range(args.repeats):
            if world > 1:
                dist.barrier()
            resident = rss_bytes("VmRSS")
            reset_peak()
            t0 = time.perf_counter()
            if layout == "gather":
                gather_save(update)
            else:
                _train_state.save_checkpoint(run, update, objs, device)
            if world > 1:
                dist.barrier()
            seconds = time.perf_counter() - t0
            peak = rss_bytes("VmHWM")
            results.append({"layout": layout, "seconds": seconds, "peak_bytes": peak - base,
                            "resident_bytes": resident - base})
            update += 1
    run.close()
    if rank == 0:
        print(MARK + json.dumps({"world": world, "params": n_params, "full_state_bytes": full_state,
                                 "results": results}), flush=True)
    ddp.teardown(created)


def launch(args: argparse.Namespace, world: int, corpus: Path, out: Path) -> dict[str, Any]:
    me = [str(Path(__file__).resolve()), "--worker", "--corpus", str(corpus), "--out", str(out),
          "--layers", str(args.layers), "--width", str(args.width), "--repeats", str(args.repeats)]
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world), *me]
           if world > 1 else [sys.executable, *me])
    # a fixed mmap threshold: glibc otherwise raises it after each large free and keeps later large
    # blocks on its heap, so RSS would count memory the process has already freed
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "131072"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SystemExit(f"world {world} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    mb = 1 << 20
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("".join(chr(32 + (i * 7919) % 90) for i in range(200_000)))
        rows = []
        for world in (int(w) for w in args.ranks.split(",")):
            rows.append(launch(args, world, corpus, Path(tmp) / f"run-{world}"))
    full = rows[0]["full_state_bytes"]
    print(f"gpt {args.layers} x {args.width}: {rows[0]['params'] / 1e6:.1f} M parameters; full state (params + "
          f"AdamW m, v, float32) {full / mb:.0f} MiB")
    print(f"{'ranks':>5}  {'layout':<8} {'save s':>7}  {'rank-0 resident MiB':>19}  {'rank-0 peak MiB':>15}  "
          f"{'save adds MiB':>13}  {'peak / full state':>17}  {'x N':>5}")
    for row in rows:
        world = row["world"]
        for layout in dict.fromkeys(r["layout"] for r in row["results"]):
            mine = [r for r in row["results"] if r["layout"] == layout]
            seconds = statistics.median(r["seconds"] for r in mine)
            peak = max(r["peak_bytes"] for r in mine)
            resident = max(r["resident_bytes"] for r in mine)
            print(f"{world:>5}  {layout:<8} {seconds:>7.2f}  {resident / mb:>19.0f}  {peak / mb:>15.0f}  "
                  f"{(peak - resident) / mb:>13.0f}  {peak / full:>17.3f}  {peak / full * world:>5.2f}")


if __name__ == "__main__":
    main()
