"""The torch trainer against a minimal hand-written loop on the same GPT, in one run: tokens/s, MFU
and trainer / minimal. Called by bench/gpu_check.sh; runs on the CPU too (tiny sizes via --set).

    python bench/gpu_throughput.py [--config configs/gpt2_small.toml] [--updates 40] [--skip 10]
                                   [--device cuda] [--set KEY=VALUE ...]

Trainer: ref_torch.trainer.train on the config (no checkpoint, no evaluation, metrics.jsonl and
every check on). Minimal loop: nanoGPT's train.py reduced to what the config asks, as a user would
write it: the same model and initial weights (build_model), the same windows (DataPipeline.window:
pinned memory, non-blocking copies), autocast in the config's dtype, token-normalized accumulation,
clip_grad_norm_, AdamW (fused on CUDA) with the lr computed in Python, torch.compile on the forward
when run.compile is set (as the trainer does), and one read of the device per update (the loss).

Both are timed the same way: the wall clock at the start of every update, so an update's time is
everything until the next one starts (the trainer's metrics line, its checks, the driver's
decisions included); the median over the updates after --skip (compilation, allocator warm-up)
gives tokens/s, and MFU is against the device's dense bf16 peak (conformance.run.throughput).
Goal: trainer / minimal <= 1.02 in time per update (docs/performance.md). The contenders run in
alternating order over --repeats rounds, each a fresh model, so a drifting machine favours neither.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.config import load_config  # noqa: E402
from conformance.data import DataPipeline  # noqa: E402
from conformance.rules.models import flops_per_token  # noqa: E402
from conformance.run.throughput import peak_flops  # noqa: E402
from ref_torch import _steps  # noqa: E402
from ref_torch.models import build_model  # noqa: E402
from ref_torch.trainer import train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.02  # trainer / minimal, time per update


def trainer_times(config: Any) -> list[float]:
    """Seconds of every update of one trainer run (start of update t to start of update t + 1)."""
    stamps: list[float] = []
    update = _steps.Steps.update

    def stamped(self: Any, t: int) -> Any:
        stamps.append(time.perf_counter())
        return update(self, t)

    _steps.Steps.update = stamped  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            train(config, Path(tmp) / "run", progress="none")
            stamps.append(time.perf_counter())
    finally:
        _steps.Steps.update = update  # type: ignore[method-assign]
    return [b - a for a, b in zip(stamps, stamps[1:])]


def _lr(config: Any, t: int) -> float:
    # nanoGPT's get_lr: linear warm-up, cosine to eta_min (other schedules: the constant peak)
    s, peak = config.schedule, config.optimizer.lr
    if s.name != "warmup_cosine":
        return peak
    if t < s.warmup_steps:
        return peak * (t + 1) / (s.warmup_steps + 1)
    ratio = min(1.0, (t - s.warmup_steps) / max(1, s.total_steps - s.warmup_steps))
    return s.eta_min + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - s.eta_min)


def minimal_times(config: Any) -> list[float]:
    """Seconds of every update of the minimal loop (the module docstring)."""
    device = torch.device(config.run.device)
    cuda = device.type == "cuda"
    data = DataPipeline(config)
    model = build_model(config.model, data.info, seed=config.run.seed, dtype=config.precision.param_dtype,
                        device=device)
    forward = torch.compile(model) if config.run.compile else model
    o = config.optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay,
                                  fused=cuda or None)
    low = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(config.precision.dtype)
    clip = config.clip.max_norm
    stamps: list[float] = []
    for t in range(config.run.max_updates):
        stamps.append(time.perf_counter())
        for group in optimizer.param_groups:
            group["lr"] = _lr(config, t)
        window = data.window(t)
        batches = [(torch.from_numpy(b.x), torch.from_numpy(b.y)) for b in window.batches]
        if cuda:
            batches = [(x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True))
                       for x, y in batches]
        tokens = sum(int(y.numel()) for _, y in batches)
        total = torch.zeros((), device=device)
        for x, y in batches:
            with torch.autocast(device.type, dtype=low or torch.float32, enabled=low is not None):
                logits = forward(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1), reduction="sum") / tokens
            loss.backward()
            total += loss.detach()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(total)  # the one read per update (the log line)
    stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "gpt2_small.toml"))
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--skip", type=int, default=10, help="updates left out of the medians (compilation, warm-up)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of both contenders, in alternating order")
    p.add_argument("--device", default="cuda")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    if args.skip >= args.updates:
        sys.exit(f"--skip {args.skip} leaves no update of --updates {args.updates} to time")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_throughput: SKIPPED: torch sees no CUDA device (use --device cpu for the CPU)")
        return 0
    overrides = [f"run.max_updates={args.updates}", "run.eval_every=0", "checkpoint.every=0",
                 "checkpoint.at_end=false", f'run.device="{args.device}"', *args.overrides]
    config = load_config(args.config, overrides)
    info = DataPipeline(config).info
    block = info.block_size or config.model.block_size
    per_update = config.data.batch_size * config.accumulation.steps * block
    name = torch.cuda.get_device_name() if args.device == "cuda" else None
    peak = peak_flops(name) if name else None
    flops = flops_per_token(config.model, info, block)
    print(f"gpu_throughput: torch {torch.__version__}, {name or args.device}, {per_update} tokens per update, "
          f"compile {config.run.compile}, {config.precision.dtype}", flush=True)
    times: dict[str, list[float]] = {"trainer": [], "minimal": []}
    for r in range(args.repeats):
        order = ("trainer", "minimal") if r % 2 == 0 else ("minimal", "trainer")
        for who in order:
            got = trainer_times(config) if who == "trainer" else minimal_times(config)
            times[who].extend(got[args.skip:])
    medians = {who: statistics.median(ts) for who, ts in times.items()}
    for who, s in medians.items():
        tps = per_update / s
        mfu = f", MFU {100 * flops * tps / peak:.1f}%" if peak else ""
        print(f"gpu_throughput: {who}: median update {1e3 * s:.1f} ms, {tps:,.0f} tokens/s{mfu} "
              f"({len(times[who])} updates timed)", flush=True)
    ratio = medians["trainer"] / medians["minimal"]
    print(f"gpu_throughput: trainer / minimal {ratio:.3f} (goal <= {GOAL})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
