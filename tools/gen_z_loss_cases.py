"""Write the z-loss conformance cases (cross_entropy with `z_loss`) from the peers' formulas in torch.

    python tools/gen_z_loss_cases.py [OUT_DIR]      # default: conformance/cases/loss/z_loss

Expected values never come from twinstep's code. Each case is torch.nn.functional.cross_entropy in
float64 (float32 for the float32 case) plus the z term written as the peers write it, with the
gradient from torch.autograd:

- OLMo-core, `olmo_core.nn.functional.cross_entropy_loss` (allenai/OLMo-core,
  src/olmo_core/nn/functional/cross_entropy_loss.py @ 011113e):
  `z_squared = logits.logsumexp(-1).pow(2); mask = labels != ignore_index`, then
  `(z_squared * mask).sum() / mask.sum()` for "mean", `(z_squared * mask).sum()` for "sum", and
  `z_loss = z_loss_multiplier * z_squared`, added to `F.cross_entropy(logits, labels, ...)`.
- MaxText, `max_utils.cross_entropy_with_logits` (AI-Hypercomputer/maxtext, from t5x): for one-hot or
  probability targets `loss = -Σ targets·log_softmax + z_loss·square(log_z)` per token, log_z the
  logsumexp of the logits, then summed over non-padding tokens and divided by their count.

Where the peers define nothing, the cases reduce torch's per-element values by hand with twinstep's
documented rule (docs/contract.md §3, `z_loss`): each element's z term is weighted by its count weight
(1; 0 where ignored; torch's class weight w_y of its target with class weights), a mask selects, a
per-sample weight multiplies the element's whole loss, and the mean divides by the cross-entropy's
own count. reduction = "none" keeps ignored elements at 0 (OLMo-core's "none" returns the z term of
ignored tokens too; docs/divergences.md L-ZLOSS).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from conformance import tomlio

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "loss" / "z_loss"
TORCH = f"torch {torch.__version__.split('+')[0]}"
OLMO = "OLMo-core's cross_entropy_loss z-loss (olmo_core/nn/functional/cross_entropy_loss.py @ 011113e)"
MAXTEXT = "MaxText's max_utils.cross_entropy_with_logits (z_loss·square(log_z) per token, mean over tokens)"
RULE = "reduced by hand with twinstep's documented z-loss rule (docs/contract.md §3)"
T = torch.tensor


def olmo_cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100,
                            reduction: str = "mean", z_loss_multiplier: float = 1e-4,
                            label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """OLMo-core's cross_entropy_loss with compute_z_loss=True (label_smoothing passed to
    F.cross_entropy; OLMo-core leaves it 0), without its float32 upcast: (ce, z_loss)."""
    loss = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    z_squared = logits.logsumexp(-1).pow(2)
    mask = labels != ignore_index
    if reduction == "mean":
        z_squared = (z_squared * mask).sum() / mask.sum()
    elif reduction == "sum":
        z_squared = (z_squared * mask).sum()
    return loss, z_loss_multiplier * z_squared


def maxtext_cross_entropy_with_logits(logits: torch.Tensor, targets: torch.Tensor,
                                      z_loss: float) -> tuple[torch.Tensor, torch.Tensor]:
    """MaxText's cross_entropy_with_logits in torch ops: per-token (loss + z term, z term)."""
    logits_sum = torch.logsumexp(logits, dim=-1, keepdim=True)
    log_softmax = logits - logits_sum
    loss = -torch.sum(targets * log_softmax, dim=-1)
    log_z = logits_sum.squeeze(-1)
    total_z_loss = z_loss * log_z.square()
    return loss + total_z_loss, total_z_loss


def by_rule(z: float, labels: np.ndarray, *, weight: np.ndarray | None = None, mask: np.ndarray | None = None,
            sample_weight: np.ndarray | None = None, reduction: str = "mean", class_dim: int = 1,
            label_smoothing: float = 0.0):
    """A function of the logits: torch's per-element cross-entropy plus z·c·(log Z)², reduced by hand."""
    y = T(labels)
    valid = y != -100
    w = None if weight is None else T(weight)
    c = valid.double() if w is None else torch.where(valid, w[torch.where(valid, y, 0)], 0.0)

    def f(a: torch.Tensor) -> torch.Tensor:
        ell = F.cross_entropy(a, y, weight=w, reduction="none", label_smoothing=label_smoothing)
        ell = ell + z * c * a.logsumexp(class_dim).pow(2)
        if sample_weight is not None:
            ell = ell * T(sample_weight)
        m = torch.ones_like(valid) if mask is None else T(mask)
        ell = torch.where(m, ell, 0.0)
        if reduction == "none":
            return ell
        return ell.sum() if reduction == "sum" else ell.sum() / torch.where(m, c, 0.0).sum()

    return f


def write(out: Path, name: str, loss: dict[str, Any], fn, x: np.ndarray, y: np.ndarray, source: str, desc: str,
          *, dtype: str = "float64", mask: np.ndarray | None = None, sample_weight: np.ndarray | None = None) -> None:
    xt = torch.tensor(x, dtype=torch.float32 if dtype == "float32" else torch.float64, requires_grad=True)
    value = fn(xt)
    value.sum().backward()
    case: dict[str, Any] = {
        "id": f"loss/{name}", "kind": "loss",
        "source": f"{TORCH} F.cross_entropy in {dtype} + {source}, autograd gradient (tools/gen_z_loss_cases.py)",
        "description": desc, "dtype": dtype, "loss": {"name": "cross_entropy", **loss},
        "inputs": {"prediction": x.tolist(), "target": y.tolist()},
        "expected": {"value": value.detach().double().numpy().tolist(), "grad": xt.grad.double().numpy().tolist()},
    }
    if dtype == "float64":
        case.pop("dtype")
    for key, extra in (("mask", mask), ("sample_weight", sample_weight)):
        if extra is not None:
            case["inputs"][key] = extra.tolist()
    (out / f"{name}.toml").write_text(tomlio.dumps(case))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.toml"):
        old.unlink()
    rng = np.random.default_rng(20260801)
    n, c = 6, 5
    x = np.round(rng.normal(size=(n, c)) * 3 + 2, 4)  # logits off zero: log Z well away from 0
    y_full = rng.integers(0, c, n)
    y = y_full.copy()
    y[[1, 4]] = -100
    w = np.round(rng.uniform(0.3, 2.0, c), 4)

    def olmo(z: float, labels: np.ndarray, reduction: str = "mean", eps: float = 0.0):
        def f(a: torch.Tensor) -> torch.Tensor:
            ce, zl = olmo_cross_entropy_loss(a, T(labels), reduction=reduction, z_loss_multiplier=z,
                                             label_smoothing=eps)
            return ce + zl
        return f

    write(out, "z-loss-plain", {"z_loss": 1e-4}, olmo(1e-4, y_full), x, y_full, OLMO,
          "OLMo-core's default multiplier 1e-4, every token counted")
    write(out, "z-loss-ignore", {"z_loss": 0.01}, olmo(0.01, y), x, y, OLMO,
          "ignored tokens add no z term; the mean divides by the non-ignored count")
    write(out, "z-loss-sum", {"z_loss": 0.01, "reduction": "sum"}, olmo(0.01, y, "sum"), x, y, OLMO,
          "reduction = 'sum': the z terms of the non-ignored tokens summed")
    write(out, "z-loss-none", {"z_loss": 0.01, "reduction": "none"}, by_rule(0.01, y, reduction="none"), x, y,
          RULE, "reduction = 'none': per-token ce + z·(log Z)², 0 for ignored tokens")
    write(out, "z-loss-smooth", {"z_loss": 0.01, "label_smoothing": 0.1}, olmo(0.01, y, eps=0.1), x, y, OLMO,
          "label smoothing changes the cross-entropy only; log Z does not depend on the target")
    mask = np.array([True, True, False, True, True, False])
    write(out, "z-loss-mask", {"z_loss": 0.01}, by_rule(0.01, y, mask=mask), x, y, RULE,
          "a token mask on top of ignore_index: masked tokens add nothing and leave the count", mask=mask)
    sw = np.round(rng.uniform(0.2, 2.0, n), 4)
    write(out, "z-loss-sample-weight", {"z_loss": 0.01}, by_rule(0.01, y, sample_weight=sw), x, y, RULE,
          "a per-sample weight multiplies the token's whole loss, z term included; the count is unchanged",
          sample_weight=sw)
    write(out, "z-loss-weight", {"z_loss": 0.01, "weight": w.tolist()}, by_rule(0.01, y, weight=w), x, y, RULE,
          "class weights: each z term weighted by w_y, as the cross-entropy, over torch's count Σ w_y")
    q = rng.dirichlet(np.ones(c), n)
    q = np.round(q, 4)
    q[:, -1] = np.round(1 - q[:, :-1].sum(1), 4)

    def maxtext(a: torch.Tensor) -> torch.Tensor:
        return maxtext_cross_entropy_with_logits(a, T(q), 0.01)[0].mean()

    write(out, "z-loss-probs", {"z_loss": 0.01}, maxtext, x, q, MAXTEXT,
          "probability targets: every row counts 1")
    x3 = np.round(rng.normal(size=(2, c, 3)) * 3, 4)
    y3 = rng.integers(0, c, (2, 3))
    y3[1, 0] = -100
    write(out, "z-loss-3d", {"z_loss": 0.05}, by_rule(0.05, y3, class_dim=1), x3, y3, RULE,
          "(N, C, L) logits: log Z over torch's class dim 1")
    write(out, "z-loss-float32", {"z_loss": 0.01}, olmo(0.01, y), x, y, OLMO,
          "float32 logits", dtype="float32")
    big = np.round(rng.normal(size=(4, c)) * 2 + 40, 4)
    yb = rng.integers(0, c, 4)
    write(out, "z-loss-large-logits", {"z_loss": 1e-3}, olmo(1e-3, yb), big, yb, OLMO,
          "logits near 40: the z term (log Z ≈ 42) dominates the cross-entropy, as when logits drift upward in long runs (PaLM's reason for z-loss)")
    print(f"wrote {len(list(out.glob('*.toml')))} cases to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
