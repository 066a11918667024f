"""Write accumulate conformance cases whose expected values come from torch in float64.

    python tools/gen_accumulate_cases.py [OUT_DIR]  # default: conformance/cases/accumulate/generated

The model is linear (logits = x @ w + b). Expected gradients are torch autograd of torch's own
losses, never twinstep's accumulation code:
- "tokens" windows: the gradient of F.cross_entropy / F.mse_loss on the window's micro-batches
  concatenated into one batch (the full-batch gradient);
- "micro_batches" windows: seed 000's loop run verbatim (loss / accumulation_steps per micro-batch,
  backward, and the remainder correction accumulation_steps / actual_steps on the last window).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from conformance import tomlio

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "accumulate" / "generated"
TORCH = f"torch {torch.__version__.split('+')[0]}"
rng = np.random.default_rng(20261209)
D_IN, C = 3, 4


def params() -> dict[str, np.ndarray]:
    return {"w": np.round(rng.normal(size=(D_IN, C)) * 0.5, 4), "b": np.round(rng.normal(size=(C,)) * 0.1, 4)}


def ce_batch(rows: int, valid: int, ignore: int = -100) -> dict[str, np.ndarray]:
    y = rng.integers(0, C, size=rows)
    y[valid:] = ignore
    return {"x": np.round(rng.normal(size=(rows, D_IN)), 4), "y": y}


def _torch_params(p: dict[str, np.ndarray], dtype=torch.float64) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in p.items()}


def _loss(name: str, logits: torch.Tensor, mb: dict[str, np.ndarray], reduction: str = "mean") -> torch.Tensor:
    if name == "cross_entropy":
        return F.cross_entropy(logits, torch.tensor(mb["y"]), ignore_index=-100, reduction=reduction)
    y = torch.tensor(mb["y"], dtype=torch.float64)
    if "mask" in mb:  # masked mean by hand: Σ over kept elements / their number
        m = torch.tensor(mb["mask"])
        return F.mse_loss(logits, y, reduction="none")[m].sum() / m.sum()
    return F.mse_loss(logits, y, reduction=reduction)


def full_batch(name: str, p: dict[str, np.ndarray], window: list[dict[str, np.ndarray]],
               dtype=torch.float64) -> tuple[dict, float]:
    tp = _torch_params(p, dtype)
    whole = {k: np.concatenate([mb[k] for mb in window]) for k in window[0]}
    loss = _loss(name, torch.tensor(whole["x"], dtype=dtype) @ tp["w"] + tp["b"], whole)
    loss.backward()
    return {k: v.grad.double().numpy().copy() for k, v in tp.items()}, float(loss.detach())


def seed_loop(name: str, p: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]], steps: int) -> tuple[list, list]:
    """seed 000 §PyTorch 训练循环, verbatim in float64: returns the gradients at every update."""
    tp = _torch_params(p)
    grads, losses, window_loss = [], [], 0.0
    for step, mb in enumerate(batches):
        raw_loss = _loss(name, torch.tensor(mb["x"]) @ tp["w"] + tp["b"], mb)
        loss = raw_loss / steps
        loss.backward()
        window_loss += float(loss.detach())
        is_last_batch = step == len(batches) - 1
        if (step + 1) % steps == 0 or is_last_batch:
            remainder = (step + 1) % steps
            actual_steps = remainder if is_last_batch and remainder else steps
            if actual_steps != steps:
                correction = steps / actual_steps
                for v in tp.values():
                    v.grad.mul_(correction)
                window_loss *= correction
            grads.append({k: v.grad.numpy().copy() for k, v in tp.items()})
            losses.append(window_loss)
            window_loss = 0.0
            for v in tp.values():
                v.grad = None
    return grads, losses


def write(name: str, body: dict[str, Any], out: Path) -> None:
    case = {"id": f"accumulate/{name}", "kind": "accumulate", **body}
    (out / f"{name}.toml").write_text(tomlio.dumps(case))


def windows(batches: list, steps: int) -> list[list]:
    return [batches[i:i + steps] for i in range(0, len(batches), steps)]


def tokens_case(name: str, loss: dict, p: dict, batches: list, steps: int, desc: str, out: Path,
                dtype: str = "float64") -> None:
    tdt = getattr(torch, dtype)
    results = [full_batch(loss["name"], p, w, tdt) for w in windows(batches, steps)]
    head = {} if dtype == "float64" else {"dtype": dtype}
    write(name, {
        **head,
        "source": f"{TORCH} full-batch gradient of F.{loss['name']} on each window's micro-batches "
                  f"concatenated, {dtype} (tools/gen_accumulate_cases.py)",
        "description": desc, "loss": loss, "accumulation": {"steps": steps, "normalize": "tokens"},
        "inputs": {"model": "linear", "params": p, "micro_batches": batches},
        "expected": {"grads": [g for g, _ in results], "loss": [v for _, v in results]}}, out)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ce = {"name": "cross_entropy"}
    p = params()
    seed = [ce_batch(4, 4) for _ in range(5)]
    grads, losses = seed_loop("cross_entropy", p, seed, steps=2)
    write("seed-000-incomplete-window", {
        "source": f"seed 000 §PyTorch 训练循环 (accumulation_steps = 2, remainder correction "
                  f"accumulation_steps / actual_steps) run verbatim with {TORCH} in float64 "
                  "(tools/gen_accumulate_cases.py)",
        "description": "5 micro-batches, steps 2: windows of 2, 2 and 1; the last is divided by 1, not 2",
        "loss": ce, "accumulation": {"steps": 2, "normalize": "micro_batches"},
        "inputs": {"model": "linear", "params": p, "micro_batches": seed},
        "expected": {"grads": grads, "loss": losses}}, out)
    write("seed-000-drop-last", {
        "source": f"seed 000 §梯度累积 (最后一个不完整累积组: drop_last); the first two windows of the seed "
                  f"loop run with {TORCH} in float64 (tools/gen_accumulate_cases.py)",
        "description": "last_window = drop: the fifth micro-batch makes no update",
        "loss": ce, "accumulation": {"steps": 2, "normalize": "micro_batches", "last_window": "drop"},
        "inputs": {"model": "linear", "params": p, "micro_batches": seed},
        "expected": {"grads": grads[:2], "loss": losses[:2]}}, out)
    uneven = [ce_batch(16, 1), ce_batch(16, 15)]
    tokens_case("tokens-1-15", ce, p, uneven, 2,
                "token counts 1 and 15 (ignore_index pads the rest): equals the full-batch gradient", out)
    whole = {k: np.concatenate([mb[k] for mb in uneven]) for k in uneven[0]}
    order = np.argsort(whole["y"] == -100, kind="stable")  # valid tokens first, then padding
    regroup = [{k: v[order][i::2] for k, v in whole.items()} for i in range(2)]
    tokens_case("tokens-8-8", ce, p, regroup, 2,
                "the same 16 tokens split 8 and 8: the same full-batch gradient as tokens-1-15", out)
    means = seed_loop("cross_entropy", p, uneven, steps=2)
    write("micro-batches-1-15", {
        "source": f"seed 000 §PyTorch 训练循环 (loss / accumulation_steps) with {TORCH} in float64 "
                  "(tools/gen_accumulate_cases.py)",
        "description": "normalize = micro_batches on counts 1 and 15: the mean of the two micro-batch means "
                       "(the 2024 bug when tokens were meant)",
        "loss": ce, "accumulation": {"steps": 2, "normalize": "micro_batches"},
        "inputs": {"model": "linear", "params": p, "micro_batches": uneven},
        "expected": {"grads": means[0], "loss": means[1]}}, out)
    ga = [ce_batch(6, v) for v in (3, 0, 6, 2, 5, 1, 4)]
    tokens_case("tokens-k4-zero-token-partial", ce, p, ga, 4,
                "steps 4 over 7 micro-batches (one with no valid token): windows of 4 and 3", out)
    pm = {"w": np.round(rng.normal(size=(D_IN, 2)), 4), "b": np.round(rng.normal(size=(2,)), 4)}
    mse = [{"x": np.round(rng.normal(size=(r, D_IN)), 4), "y": np.round(rng.normal(size=(r, 2)), 4),
            "mask": rng.random((r, 2)) > 0.3} for r in (2, 5, 3)]
    for mb in mse:
        mb["mask"][0, 0] = True  # every micro-batch keeps at least one element
    tokens_case("tokens-mse-masked", {"name": "mse"}, pm, mse, 3,
                "masked mse over micro-batches of 2, 5 and 3 rows: the masked full-batch mean", out)
    p32 = {k: v.astype(np.float32).astype(np.float64) for k, v in params().items()}
    b32 = [ce_batch(8, v) for v in (8, 3, 6)]
    for mb in b32:
        mb["x"] = mb["x"].astype(np.float32).astype(np.float64)
    tokens_case("tokens-float32", ce, p32, b32, 3, "the token-weighted window in float32", out, dtype="float32")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
