"""Write loss conformance cases whose expected values come from torch.nn.functional in float64.

    python tools/gen_loss_cases.py [OUT_DIR]      # default: conformance/cases/loss/generated

Values and gradients are torch's own built-in reductions (reduction="mean"/"sum"/"none") and
autograd, never twinstep's code. Masked cases use torch's per-element values (reduction="none")
reduced by hand: masked sum / masked count. Inputs are rounded to 4 decimals so files stay readable.
sigmoid_focal cases evaluate torchvision's formula in torch ops, and sample_weight cases reduce
torch's per-element values as Keras does (both in tools/_loss_refs.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from conformance import tomlio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the references beside this script, however it is loaded
from _loss_families import write_families  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "loss" / "generated"
TORCH = f"torch {torch.__version__.split('+')[0]}"
rng = np.random.default_rng(20261129)
# the derived bound of bce-extreme-logits: its small gradients are known to float64 in absolute terms only
BCE_SATURATED = ("at |x| = 30 the gradient (σ(x) − y)/4 ≈ 2.3e-14 is a difference of two numbers near 1: torch "
                 "rounds σ(30) to a multiple of u = 1.1e-16 (1e-3 relative there), JAX differentiates log σ "
                 "through softplus(30), which carries |x|·u = 3.3e-15 before the mean's 1/4 (measured 3.0e-16 "
                 "after); atol 1e-15 = |x|·u/4 rounded up, 1000 times below the default")


def r(x: np.ndarray) -> np.ndarray:
    return np.round(x, 4)


def logits(*shape: int, scale: float = 2.0) -> np.ndarray:
    return r(rng.normal(size=shape) * scale)


def probs(n: int, c: int) -> np.ndarray:
    p = rng.dirichlet(np.ones(c), n)
    p = np.round(p, 4)
    p[:, -1] = np.round(1 - p[:, :-1].sum(1), 4)  # rows sum to 1 after rounding
    return p


def evaluate(fn, x: np.ndarray, dtype=torch.float64) -> tuple[np.ndarray, np.ndarray]:
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    v = fn(xt)
    v.sum().backward()
    return v.detach().double().numpy(), xt.grad.double().numpy()


def write(name: str, case: dict[str, Any], out: Path) -> None:
    case = {"id": f"loss/{name}", "kind": "loss", **case}
    (out / f"{name}.toml").write_text(tomlio.dumps(_plain(case)))


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def case(name: str, loss: dict, fn, x, y, out: Path, *, weight=None, mask=None, dtype="float64",
         desc: str = "", call: str = "", sample_weight=None, tolerance: dict | None = None) -> None:
    """Evaluate `fn(x_tensor)` (a torch built-in call) and write the case."""
    tdt = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    value, grad = evaluate(fn, x, tdt)
    source = f"{TORCH} {call or 'torch.nn.functional'} in {dtype}, autograd gradient (tools/gen_loss_cases.py)"
    inputs = {"prediction": x, "target": y, "weight": weight, "mask": mask, "sample_weight": sample_weight}
    body: dict[str, Any] = {"source": source, "description": desc, "dtype": dtype, "loss": loss,
                            "inputs": inputs, "expected": {"value": value, "grad": grad}, "tolerance": tolerance}
    if dtype == "float64":
        body.pop("dtype")
    write(name, body, out)


def masked(fn_none, mask: np.ndarray, count_w=None):
    """Reduce torch's per-element values by hand: Σ m ℓ / Σ m c (torch.where selects)."""
    m = torch.tensor(mask) != 0

    def f(xt):
        ell = fn_none(xt)
        c = torch.ones_like(ell) if count_w is None else count_w
        return torch.where(m, ell, 0).sum() / torch.where(m, c, 0).sum()

    return f


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.toml"):
        old.unlink()
    T = torch.tensor
    # --- regression losses ------------------------------------------------------------------
    x, y = logits(4, 3), logits(4, 3)
    for red in ("mean", "sum", "none"):
        case(f"mse-{red}", {"name": "mse", "reduction": red}, lambda a, red=red: F.mse_loss(a, T(y), reduction=red),
             x, y, out, call=f"F.mse_loss(reduction='{red}')")
        case(f"l1-{red}", {"name": "l1", "reduction": red}, lambda a, red=red: F.l1_loss(a, T(y), reduction=red),
             x, y, out, call=f"F.l1_loss(reduction='{red}')")
    mask = rng.random((4, 3)) > 0.3
    case("mse-mask", {"name": "mse"}, masked(lambda a: F.mse_loss(a, T(y), reduction="none"), mask), x, y, out,
         mask=mask, call="F.mse_loss(reduction='none') reduced by hand over the mask",
         desc="element mask: mean over unmasked elements only")
    e = np.array([-2.0, -0.5, 0.5, 2.0, 0.7, -0.7])  # includes |e| == delta for delta 0.7 and 2
    yh = np.zeros(6)
    for d in (1.0, 0.7, 2.0):
        case(f"huber-delta-{d:g}", {"name": "huber", "delta": d},
             lambda a, d=d: F.huber_loss(a, T(yh), delta=d), e, yh, out, call=f"F.huber_loss(delta={d:g})",
             desc="errors on both sides of delta, and exactly at it")
    case("huber-sum", {"name": "huber", "delta": 0.5, "reduction": "sum"},
         lambda a: F.huber_loss(a, T(y), delta=0.5, reduction="sum"), x, y, out, call="F.huber_loss(delta=0.5, 'sum')")
    for b in (1.0, 0.5, 0.0):
        case(f"smooth-l1-beta-{b:g}", {"name": "smooth_l1", "beta": b},
             lambda a, b=b: F.smooth_l1_loss(a, T(yh), beta=b), e, yh, out, call=f"F.smooth_l1_loss(beta={b:g})",
             desc="beta = 0 is L1" if b == 0 else "smooth_l1 = huber / beta")
    case("smooth-l1-none", {"name": "smooth_l1", "beta": 2.0, "reduction": "none"},
         lambda a: F.smooth_l1_loss(a, T(y), beta=2.0, reduction="none"), x, y, out, call="F.smooth_l1_loss(beta=2, 'none')")
    # --- cross-entropy with class indices -------------------------------------------------
    n, c = 6, 4
    x = logits(n, c)
    yi = rng.integers(0, c, n)
    yi[[1, 4]] = -100
    w = r(rng.uniform(0.3, 2.0, c))
    combos = [(False, False, 0.0), (True, False, 0.0), (False, True, 0.0), (False, False, 0.2),
              (True, True, 0.0), (True, False, 0.2), (False, True, 0.2), (True, True, 0.2)]
    for use_w, use_ign, eps in combos:
        tgt = yi if use_ign else np.where(yi < 0, 0, yi)
        parts = ["ce"] + (["weight"] if use_w else []) + (["ignore"] if use_ign else []) + (["smooth"] if eps else [])
        name = "-".join(parts) if len(parts) > 1 else "ce-plain"
        spec = {"name": "cross_entropy", "label_smoothing": eps or None, "weight": w if use_w else None}
        case(name, spec, lambda a, tgt=tgt, use_w=use_w, eps=eps: F.cross_entropy(
            a, T(tgt), weight=T(w) if use_w else None, label_smoothing=eps), x, tgt, out,
            call="F.cross_entropy", desc="class indices; weighted mean divides by the sum of target weights")
    for red in ("sum", "none"):
        case(f"ce-weight-ignore-smooth-{red}", {"name": "cross_entropy", "label_smoothing": 0.1, "weight": w,
             "reduction": red}, lambda a, red=red: F.cross_entropy(a, T(yi), weight=T(w), label_smoothing=0.1,
             reduction=red), x, yi, out, call=f"F.cross_entropy(reduction='{red}')")
    yo = np.where(yi < 0, 2, yi)
    case("ce-ignore-index-in-range", {"name": "cross_entropy", "ignore_index": 2},
         lambda a: F.cross_entropy(a, T(yo), ignore_index=2), x, yo, out, call="F.cross_entropy(ignore_index=2)",
         desc="ignore_index may be a real class: its targets are skipped")
    x3 = logits(2, c, 5)
    y3 = rng.integers(0, c, (2, 5))
    y3[0, 1] = -100
    case("ce-3d", {"name": "cross_entropy", "label_smoothing": 0.1},
         lambda a: F.cross_entropy(a, T(y3), label_smoothing=0.1), x3, y3, out,
         call="F.cross_entropy on (N, C, L)", desc="classes on dim 1, as torch")
    x1 = logits(c)
    case("ce-unbatched", {"name": "cross_entropy"}, lambda a: F.cross_entropy(a, T(np.array(2))), x1,
         np.array(2), out, call="F.cross_entropy on (C,)")
    tok_mask = rng.random(n) > 0.3
    tok_mask[0] = True
    valid = (yi != -100)
    cw = T(np.where(valid, w[np.where(valid, yi, 0)], 0.0))
    case("ce-mask-weight-ignore", {"name": "cross_entropy", "weight": w},
         masked(lambda a: F.cross_entropy(a, T(yi), weight=T(w), reduction="none"), tok_mask, cw), x, yi, out,
         mask=tok_mask, call="F.cross_entropy(reduction='none') reduced by hand over the mask",
         desc="token mask on top of ignore_index and class weights")
    case("ce-float32", {"name": "cross_entropy", "label_smoothing": 0.1, "weight": w},
         lambda a: F.cross_entropy(a, T(yi, dtype=torch.long), weight=T(w, dtype=torch.float32), label_smoothing=0.1),
         x, yi, out, dtype="float32", call="F.cross_entropy")
    case("ce-bfloat16", {"name": "cross_entropy"},
         lambda a: F.cross_entropy(a.float(), T(np.where(yi < 0, 0, yi))), x, np.where(yi < 0, 0, yi), out,
         dtype="bfloat16", call="F.cross_entropy on bfloat16 logits upcast to float32 (as autocast does)")
    # --- cross-entropy with probabilities ---------------------------------------------------
    q = probs(n, c)
    for use_w, eps in [(False, 0.0), (False, 0.25), (True, 0.0), (True, 0.25)]:
        name = "ce-probs" + ("-weight" if use_w else "") + ("-smooth" if eps else "")
        case(name, {"name": "cross_entropy", "label_smoothing": eps or None, "weight": w if use_w else None},
             lambda a, use_w=use_w, eps=eps: F.cross_entropy(a, T(q), weight=T(w) if use_w else None,
             label_smoothing=eps), x, q, out, call="F.cross_entropy with probability targets",
             desc="probability targets: the mean divides by the batch size, not by the weights")
    # --- nll -------------------------------------------------------------------------------
    lp = np.log(probs(n, c).clip(1e-4))
    lp = r(lp)
    for use_w, use_ign in [(False, False), (True, False), (False, True), (True, True)]:
        tgt = yi if use_ign else np.where(yi < 0, 1, yi)
        name = "nll" + ("-weight" if use_w else "") + ("-ignore" if use_ign else "")
        case(name, {"name": "nll", "weight": w if use_w else None},
             lambda a, tgt=tgt, use_w=use_w: F.nll_loss(a, T(tgt), weight=T(w) if use_w else None), lp, tgt, out,
             call="F.nll_loss")
    case("nll-sum", {"name": "nll", "reduction": "sum"}, lambda a: F.nll_loss(a, T(yi), reduction="sum"), lp, yi, out,
         call="F.nll_loss(reduction='sum')")
    # --- bce with logits --------------------------------------------------------------------
    xb = logits(5, 3, scale=3.0)
    yb = r(rng.uniform(0, 1, (5, 3)))
    yb[0] = [1.0, 0.0, 1.0]
    pw = r(rng.uniform(0.5, 3.0, 3))
    wb = r(rng.uniform(0.2, 2.0, 3))
    for use_w, use_pw in [(False, False), (True, False), (False, True), (True, True)]:
        name = "bce" + ("-weight" if use_w else "") + ("-pos-weight" if use_pw else "")
        case(name, {"name": "bce_with_logits", "weight": wb if use_w else None, "pos_weight": pw if use_pw else None},
             lambda a, use_w=use_w, use_pw=use_pw: F.binary_cross_entropy_with_logits(
                 a, T(yb), weight=T(wb) if use_w else None, pos_weight=T(pw) if use_pw else None),
             xb, yb, out, call="F.binary_cross_entropy_with_logits",
             desc="weight multiplies each element; the mean still divides by the element count")
    for red in ("sum", "none"):
        case(f"bce-{red}", {"name": "bce_with_logits", "reduction": red, "pos_weight": pw},
             lambda a, red=red: F.binary_cross_entropy_with_logits(a, T(yb), pos_weight=T(pw), reduction=red),
             xb, yb, out, call=f"F.binary_cross_entropy_with_logits(reduction='{red}')")
    xe = np.array([800.0, -800.0, 30.0, -30.0])
    ye = np.array([0.0, 1.0, 1.0, 0.0])
    case("bce-extreme-logits", {"name": "bce_with_logits"}, lambda a: F.binary_cross_entropy_with_logits(a, T(ye)),
         xe, ye, out, call="F.binary_cross_entropy_with_logits", desc="|logit| = 800 must stay finite",
         tolerance={"atol": 1e-15, "rtol": 1e-10, "why": BCE_SATURATED})
    # --- kl divergence ----------------------------------------------------------------------
    lq = r(np.log(probs(4, 5).clip(1e-4)))
    p = probs(4, 5)
    p[0, 0], p[0, 1] = 0.0, p[0, 0] + p[0, 1]
    for red in ("mean", "batchmean", "sum", "none"):
        case(f"kl-{red}", {"name": "kl_div", "reduction": red}, lambda a, red=red: F.kl_div(a, T(p), reduction=red),
             lq, p, out, call=f"F.kl_div(reduction='{red}')", desc="target probabilities, one of them exactly 0")
    lt = r(np.log(probs(4, 5).clip(1e-4)))
    for red in ("mean", "batchmean"):
        case(f"kl-log-target-{red}", {"name": "kl_div", "reduction": red, "log_target": True},
             lambda a, red=red: F.kl_div(a, T(lt), reduction=red, log_target=True), lq, lt, out,
             call=f"F.kl_div(log_target=True, reduction='{red}')")
    write_families(out, case, masked)
    print(f"wrote {len(list(out.glob('*.toml')))} cases to {out}")



if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
