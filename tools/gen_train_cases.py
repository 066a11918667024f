"""Write `train` conformance cases whose expected values come from a plain hand-written torch loop.

    python tools/gen_train_cases.py [OUT_DIR]      # default: conformance/cases/train/generated

The reference loop is seed 000's (§完整训练循环) on torch built-ins only — nn.Linear / nn.GELU /
nn.LayerNorm, F.cross_entropy / F.mse_loss, torch.optim.SGD / AdamW, torch.optim.lr_scheduler,
clip_grad_norm_, torch.autocast and torch.amp.GradScaler("cpu") — never twinstep's trainer, data
pipeline or model code. What the loop needs from the twinstep run it must reproduce (the data,
the initial weights, the shuffle) is re-derived here from the documented definitions
(docs/models.md: PCG64 streams keyed by purpose, the stable argsort of raw draws, torch's
nn.Linear bounds). Per update the loop records the window loss, the lr of each group, whether the
update was skipped (GradScaler's scale backed off) and the loss scale in force; the schedule is
stepped only after applied updates (docs/contract.md §2, schedule_on_skip = "hold"), per epoch when the
schedule's unit is "epoch" (the seeds' placement).
"""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from conformance import tomlio

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "train" / "generated"
TORCH = f"torch {torch.__version__.split('+')[0]}"


# --- the data, weights and order of a twinstep run, re-derived from docs/models.md --------------

def _stream(seed: int, purpose: str, *more: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, int.from_bytes(purpose.encode(), "big"), *more])


def dataset(data: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training split of linear_regression (seed 001: all of it) or binary_blobs (seed 000: the first
    n - n_val samples)."""
    n = data["n_samples"]
    if data["name"] == "linear_regression":
        x = np.linspace(-1.0, 1.0, n).reshape(-1, 1)
        return x, 3.0 * x + 2.0
    x = np.random.Generator(np.random.PCG64(_stream(seed, "binary_blobs"))).standard_normal((n, 20))
    y = (x[:, :5].sum(axis=1) > 0).astype(np.int64)
    n_val = max(1, int(math.floor(n * data["val_fraction"] + 0.5)))
    return x[: n - n_val], y[: n - n_val]


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    bits = np.random.PCG64(_stream(seed, "shuffle", epoch)).random_raw(n)
    return np.argsort(np.asarray(bits, np.uint64), kind="stable")


def init_weights(model: nn.Module, seed: int) -> None:
    """torch's nn.Linear init bounds (U(±1/√fan_in), bias with its weight's fan-in), LayerNorm 1/0,
    each parameter from PCG64(SeedSequence([seed, first 8 bytes of sha256(name)]))."""
    shapes = {k: tuple(p.shape) for k, p in model.named_parameters()}
    norms = {k for k, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            if owner in norms:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
                continue
            key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, key])))
            fan_in = shapes[(owner + "." if owner else "") + "weight"][1]
            bound = 1.0 / math.sqrt(fan_in)
            p.copy_(torch.from_numpy(rng.uniform(-bound, bound, shapes[name])))


def make_model(spec: dict[str, Any], in_f: int, out_f: int) -> nn.Module:
    if spec["name"] == "linear":
        return nn.Linear(in_f, out_f)
    layers: list[nn.Module] = []
    width = in_f
    for h in spec["hidden"]:
        layers += [nn.Linear(width, h), nn.GELU(), nn.LayerNorm(h)]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, out_f))


# --- seed 000's loop --------------------------------------------------------------------------

def make_scheduler(spec: dict[str, Any], opt: torch.optim.Optimizer) -> Any:
    name = spec.get("name", "constant")
    s = torch.optim.lr_scheduler
    if name == "constant":
        return None
    if name == "step":
        return s.StepLR(opt, step_size=spec["step_size"], gamma=spec["gamma"])
    if name == "cosine":
        return s.CosineAnnealingLR(opt, T_max=spec["t_max"], eta_min=spec.get("eta_min", 0.0))
    if name == "warmup_cosine":  # convention "torch": LinearLR then CosineAnnealingLR
        w, total = spec["warmup_steps"], spec["total_steps"]
        return s.SequentialLR(opt, [s.LinearLR(opt, spec["start_factor"], 1.0, w),
                                    s.CosineAnnealingLR(opt, total - w, spec.get("eta_min", 0.0))], [w])
    raise ValueError(name)


def reference_run(cfg: dict[str, Any]) -> dict[str, Any]:
    seed = cfg["run"].get("seed", 0)
    prec = cfg.get("precision", {})
    half = prec.get("dtype") in ("float16", "bfloat16")
    dtype = torch.float64 if prec.get("dtype") == "float64" else torch.float32
    x_all, y_all = dataset(cfg["data"], cfg["data"].get("seed", seed))
    classes = cfg["loss"]["name"] == "cross_entropy"
    model = make_model(cfg["model"], x_all.shape[1], 2 if classes else 1).to(dtype)
    init_weights(model, seed)
    torch.manual_seed(seed)
    o = cfg["optimizer"]
    if o["name"] == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o.get("momentum", 0.0),
                                                     nesterov=o.get("nesterov", False))
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=o["lr"], weight_decay=o.get("weight_decay", 1e-2))
    sched_spec = cfg.get("schedule", {})
    sched = make_scheduler(sched_spec, opt)
    per_epoch = sched_spec.get("unit") == "epoch"
    dynamic = prec.get("loss_scale") == "dynamic" or prec.get("dtype") == "float16"
    scaler = torch.amp.GradScaler("cpu", init_scale=prec.get("init_scale", 2.0**16),
                                  growth_interval=prec.get("growth_interval", 2000), enabled=dynamic)
    acc = cfg.get("accumulation", {})
    k, tokens = acc.get("steps", 1), acc.get("normalize") == "tokens"
    batch = cfg["data"]["batch_size"]
    max_norm = cfg.get("clip", {}).get("max_norm")
    inject = set(cfg["run"].get("inject_nonfinite", []))
    n = len(x_all)
    micro = [(i, min(i + batch, n)) for i in range(0, n, batch)]
    windows = [micro[i:i + k] for i in range(0, len(micro), k)]
    total = cfg["run"].get("max_updates") or cfg["run"]["epochs"] * len(windows)
    out: dict[str, list[Any]] = {"loss": [], "lr": [], "skipped": [], "loss_scale": []}
    t = 0
    for epoch in range(10**6):
        order = epoch_order(seed, epoch, n)
        for window in windows:
            if t == total:
                break
            opt.zero_grad(set_to_none=True)
            parts = [(torch.from_numpy(x_all[order[a:b]]).to(dtype), torch.from_numpy(y_all[order[a:b]]))
                     for a, b in window]
            y_count = sum(float(y.numel()) for _, y in parts)
            logged = 0.0
            for xb, yb in parts:
                with torch.autocast("cpu", dtype=getattr(torch, prec.get("dtype", "float32")), enabled=half):
                    pred = model(xb)
                    loss_fn = F.cross_entropy if classes else F.mse_loss
                    yb = yb if classes else yb.to(dtype)
                    part = loss_fn(pred, yb, reduction="sum") / y_count if tokens else loss_fn(pred, yb) / k
                if t in inject:
                    part = part * math.inf
                logged += float(part.detach()) * (1.0 if tokens else k / len(parts))
                scaler.scale(part).backward()
            if not tokens and len(parts) != k:  # seed 000's correction of the incomplete last window
                for p in model.parameters():
                    p.grad.mul_(k / len(parts))
            scaler.unscale_(opt)
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
            scale = scaler.get_scale() if dynamic else math.nan
            out["lr"].append([g["lr"] for g in opt.param_groups])
            scaler.step(opt)
            scaler.update()
            skipped = dynamic and scaler.get_scale() < scale  # HF's test: the scale backed off
            if sched is not None and not per_epoch and not skipped:
                sched.step()
            out["loss"].append(logged)
            out["skipped"].append(bool(skipped))
            out["loss_scale"].append(scale)
            t += 1
        if sched is not None and per_epoch:
            sched.step()
        if t == total:
            break
    out["final_params"] = {k: p.detach().double().numpy().copy() for k, p in model.named_parameters()}
    return out


# --- the cases ---------------------------------------------------------------------------------

BLOBS = {"name": "binary_blobs", "n_samples": 100, "val_fraction": 0.2, "batch_size": 12}
MLP = {"name": "mlp", "hidden": [8]}


def config(**sections: Any) -> dict[str, Any]:
    cfg = {"model": MLP, "data": BLOBS, "loss": {"name": "cross_entropy"},
           "optimizer": {"name": "adamw", "lr": 1e-2, "weight_decay": 1e-2},
           "precision": {"dtype": "float64"}, "checkpoint": {"at_end": False},
           "run": {"epochs": 2, "eval_every": 0, "device": "cpu"}}
    for name, table in sections.items():
        base = cfg.get(name, {})
        # another model / data set / loss starts from its own defaults, not the MLP's
        cfg[name] = table if table.get("name", base.get("name")) != base.get("name") else {**base, **table}
    return cfg


CASES: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
    "linear-regression-sgd": (
        "seed 001 §3.2 (y = 3x + 2, SGD lr 0.2, batch 16, 20 epochs) in float64",
        config(model={"name": "linear"}, data={"name": "linear_regression", "n_samples": 64, "batch_size": 16},
               loss={"name": "mse"}, optimizer={"name": "sgd", "lr": 0.2}, run={"epochs": 20}),
        "float64", {}),
    "accumulation-incomplete-window": (
        "seed 000's loop: accumulation 3 over 7 micro-batches (windows 3, 3, 1), loss / steps and the "
        "remainder correction; AdamW",
        config(accumulation={"steps": 3, "normalize": "micro_batches"}), "float64", {}),
    "accumulation-tokens": (
        "accumulation 3 over 7 micro-batches normalized by the window's element count (Σ sum / N)",
        config(accumulation={"steps": 3, "normalize": "tokens"}), "float64", {}),
    "clip-sgd-momentum-step-per-epoch": (
        "SGD momentum 0.9 with clip_grad_norm_ 0.05 (active every update), StepLR stepped once per "
        "epoch as the seeds place it (schedule.unit = 'epoch')",
        config(optimizer={"name": "sgd", "lr": 0.5, "momentum": 0.9}, clip={"max_norm": 0.05},
               schedule={"name": "step", "unit": "epoch", "step_size": 1, "gamma": 0.5}, run={"epochs": 3}),
        "float64", {}),
    "warmup-cosine-torch": (
        "AdamW with SequentialLR(LinearLR(0.1, 1, 3), CosineAnnealingLR(7)) per update and clipping at 1.0",
        config(schedule={"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 10, "start_factor": 0.1,
                         "eta_min": 1e-4, "convention": "torch"}, clip={"max_norm": 1.0}, run={"epochs": 4}),
        "float64", {}),
    "bf16-autocast": (
        "torch.autocast('cpu', bfloat16) over float32 master weights, AdamW, 6 updates; tolerance: the "
        "bfloat16 default of docs/contract.md §3 (a framework's bf16 kernels may round differently)",
        config(precision={"dtype": "bfloat16"}, run={"max_updates": 6, "epochs": 1}), "bfloat16", {}),
    "fp16-injected-overflows": (
        "seed 000's GradScaler loop in float16 autocast (float32 master weights): overflows injected at "
        "updates 1, 2 and 4 (losses × inf) are skipped, the scale halves and the StepLR holds",
        config(precision={"dtype": "float16", "init_scale": 1024.0, "growth_interval": 2},
               schedule={"name": "step", "step_size": 1, "gamma": 0.7}, clip={"max_norm": 1.0},
               run={"max_updates": 8, "epochs": 1, "inject_nonfinite": [1, 2, 4]}), "float16", {}),
}


def write_case(out: Path, name: str, source: str, cfg: dict[str, Any], dtype: str) -> None:
    ref = reference_run(cfg)
    expected: dict[str, Any] = {"final_params": ref["final_params"], "loss": ref["loss"], "lr": ref["lr"]}
    if any(ref["skipped"]) or cfg.get("precision", {}).get("dtype") == "float16":
        expected.update(skipped=ref["skipped"], loss_scale=ref["loss_scale"])
    case = {"id": f"train/{name}", "kind": "train", "source": f"{source}; expected from a plain torch loop "
            f"(tools/gen_train_cases.py, {TORCH})", "dtype": dtype, "backends": ["torch", "jax"],
            **cfg, "expected": expected}
    (out / f"{name}.toml").write_text(tomlio.dumps(case))


def main(argv: list[str]) -> None:
    out = Path(argv[1]) if len(argv) > 1 else OUT
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name, (source, cfg, dtype, _) in CASES.items():
        write_case(out, name, source, cfg, dtype)
        print(f"wrote {out / name}.toml")


if __name__ == "__main__":
    main(sys.argv)
