"""Loss case families of tools/gen_loss_cases.py for -inf logits, broadcast pos_weight, 0/1 masks,
sigmoid_focal and sample_weight.

Expected values: torch.nn.functional in float64 with autograd gradients; torchvision's focal
formula and Keras's sample_weight reduction from _loss_refs.py. These families draw from their own
random generator, so the older cases keep their inputs. `case` and `masked` are the generator's
helpers (evaluate a torch function of the prediction and write the file; reduce over a mask).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _loss_refs import sigmoid_focal_loss, weighted_mean

NINF = -np.inf
T = torch.tensor
FOCAL = "torchvision.ops.sigmoid_focal_loss's formula (torchvision/ops/focal_loss.py, pytorch/vision@148ddaa) in torch ops"
KERAS = "reduced as keras.losses.Loss reduces sample_weight (sum_over_batch_size: Σ s·ℓ / count)"


def write_families(out: Path, case: Callable, masked: Callable) -> None:
    rng = np.random.default_rng(20260713)
    neg_inf(out, case, masked, rng)
    pos_weight(out, case, rng)
    float_masks(out, case, masked, rng)
    focal(out, case, masked, rng)
    sample_weights(out, case, rng)
    pos_inf(out, case, masked)


def _logits(rng: np.random.Generator, *shape: int, scale: float = 2.0) -> np.ndarray:
    return np.round(rng.normal(size=shape) * scale, 4)


def neg_inf(out: Path, case: Callable, masked: Callable, rng: np.random.Generator) -> None:
    """-inf logits (probability 0): torch's finite values and gradients, +inf where the target's own
    class is -inf, NaN where torch computes 0·(-inf)."""
    n, c = 5, 4
    x = _logits(rng, n, c)
    y = np.array([0, 2, 1, 3, 2])
    for i, k in enumerate([1, 3, 0, 0, 1]):
        x[i, k] = NINF  # another class than the target
    x[3, 1] = NINF
    w = np.round(rng.uniform(0.3, 2.0, c), 4)
    idx = "-inf logits on other classes than the target (probability 0, the masking idiom)"
    case("ce-neg-inf", {"name": "cross_entropy"}, lambda a: F.cross_entropy(a, T(y)), x, y, out,
         call="F.cross_entropy", desc=f"{idx}: finite value and gradient")
    yi = y.copy()
    yi[2] = -100  # the ignored row has its class 0 at -inf
    case("ce-neg-inf-weight-ignore", {"name": "cross_entropy", "weight": w},
         lambda a: F.cross_entropy(a, T(yi), weight=T(w)), x, yi, out, call="F.cross_entropy(weight)",
         desc=f"{idx}, with class weights and an ignored row")
    case("ce-neg-inf-smooth", {"name": "cross_entropy", "label_smoothing": 0.1},
         lambda a: F.cross_entropy(a, T(y), label_smoothing=0.1), x, y, out, call="F.cross_entropy(label_smoothing=0.1)",
         desc="label smoothing sums log p over every class: +inf with any -inf logit; the gradient stays finite")
    yt = y.copy()
    yt[0] = 1  # row 0's target class is -inf
    for red in ("none", "mean"):
        case(f"ce-neg-inf-target-{red}", {"name": "cross_entropy", "reduction": red},
             lambda a, red=red: F.cross_entropy(a, T(yt), reduction=red), x, yt, out,
             call=f"F.cross_entropy(reduction='{red}')",
             desc="the target's own class is -inf: that element's loss is +inf (finite gradient); in training the "
                  "non-finite policy takes over")
    keep = np.array([0.0, 1.0, 1.0, 1.0, 1.0])
    case("ce-neg-inf-target-masked", {"name": "cross_entropy"},
         masked(lambda a: F.cross_entropy(a, T(yt), reduction="none"), keep), x, yt, out, mask=keep,
         call="F.cross_entropy(reduction='none') reduced by hand over a 0/1 float mask (torch.where)",
         desc="the +inf element is masked out: a mask selects, it does not multiply (0·inf would be NaN)")
    case("ce-neg-inf-float32", {"name": "cross_entropy", "weight": w},
         lambda a: F.cross_entropy(a, T(y), weight=T(w, dtype=torch.float32)), x, y, out, dtype="float32",
         call="F.cross_entropy(weight)", desc=idx)
    x3 = _logits(rng, 2, c, 3)
    y3 = np.array([[0, 1, 2], [3, 3, 0]])
    x3[0, 3, :] = NINF
    x3[1, 1, 1] = NINF
    x3[1, 2, 0] = NINF
    case("ce-neg-inf-3d", {"name": "cross_entropy"}, lambda a: F.cross_entropy(a, T(y3)), x3, y3, out,
         call="F.cross_entropy on (N, C, L)", desc="-inf logits on dim 1 (classes) of (N, C, L)")
    xp = np.round(rng.normal(size=(3, c)), 4)
    xp[0, 1] = xp[1, 2] = NINF
    q = np.array([[0.5, 0.0, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    case("ce-probs-neg-inf-none", {"name": "cross_entropy", "reduction": "none"},
         lambda a: F.cross_entropy(a, T(q), reduction="none"), xp, q, out,
         call="F.cross_entropy(reduction='none') with probability targets",
         desc="row 0: q = 0 at the -inf class gives NaN (torch computes 0·(-inf)); row 1: q > 0 there gives +inf")
    lp = np.round(np.log(rng.dirichlet(np.ones(c), n)), 4)
    yn = np.array([0, 2, -100, 3, 1])
    lp[0, 1] = lp[1, 3] = lp[2, 0] = lp[3, 0] = NINF  # the ignored row 2 reads class 0
    case("nll-neg-inf", {"name": "nll", "weight": w}, lambda a: F.nll_loss(a, T(yn), weight=T(w)), lp, yn, out,
         call="F.nll_loss(weight)", desc="-inf log-probabilities off the target, and at class 0 of an ignored row")
    ynt = np.array([1, 2, -100, 3, 1])
    case("nll-neg-inf-target-none", {"name": "nll", "reduction": "none"},
         lambda a: F.nll_loss(a, T(ynt), reduction="none"), lp, ynt, out, call="F.nll_loss(reduction='none')",
         desc="row 0's target log-probability is -inf: +inf; the ignored row is 0")
    xb = _logits(rng, 3, 4, scale=3.0)
    yb = np.round(rng.uniform(0, 1, (3, 4)), 4)
    yb[0] = [0.0, 1.0, 0.5, 1.0]
    xb[0, :3] = NINF
    xb[2, 1] = NINF
    pw = np.round(rng.uniform(0.5, 3.0, 4), 4)
    case("bce-neg-inf-none", {"name": "bce_with_logits", "reduction": "none", "pos_weight": pw},
         lambda a: F.binary_cross_entropy_with_logits(a, T(yb), pos_weight=T(pw), reduction="none"), xb, yb, out,
         call="F.binary_cross_entropy_with_logits(reduction='none')",
         desc="at a -inf logit torch's (1 − y)·x − (1 + (pw − 1)·y)·log σ(x) is NaN for every target; the gradient "
              "(−pw·y) is finite")
    mb = np.where(np.isneginf(xb), 0.0, 1.0)
    case("bce-neg-inf-masked", {"name": "bce_with_logits", "pos_weight": pw},
         masked(lambda a: F.binary_cross_entropy_with_logits(a, T(yb), pos_weight=T(pw), reduction="none"), mb),
         xb, yb, out, mask=mb, call="F.binary_cross_entropy_with_logits(reduction='none') reduced by hand over a 0/1 "
         "float mask (torch.where)", desc="the -inf logits are masked out: finite value and gradient")


def pos_inf(out: Path, case: Callable, masked: Callable) -> None:
    """+inf logits (probability 1) in bce_with_logits, with torch's values: +inf for y < 1, NaN for y = 1
    (0·inf), and the finite gradient (1 + (pw − 1)·y)·σ(x) − pw·y = 1 − y."""
    rng = np.random.default_rng(20261206)  # its own stream: the families above keep their values
    xb = _logits(rng, 3, 4, scale=3.0)
    yb = np.round(rng.uniform(0, 1, (3, 4)), 4)
    yb[0] = [0.0, 1.0, 0.5, 1.0]
    xb[0, :3] = np.inf
    xb[2, 1] = np.inf
    pw = np.round(rng.uniform(0.5, 3.0, 4), 4)
    bce = F.binary_cross_entropy_with_logits
    case("bce-pos-inf-none", {"name": "bce_with_logits", "reduction": "none", "pos_weight": pw},
         lambda a: bce(a, T(yb), pos_weight=T(pw), reduction="none"), xb, yb, out,
         call="F.binary_cross_entropy_with_logits(reduction='none')",
         desc="at a +inf logit torch's (1 − y)·x − (1 + (pw − 1)·y)·log σ(x) is +inf for y < 1 and NaN for y = 1 "
              "(0·inf); the gradient 1 − y is finite")
    case("bce-pos-inf-mean", {"name": "bce_with_logits"}, lambda a: bce(a, T(yb)), xb, yb, out,
         call="F.binary_cross_entropy_with_logits()", desc="the mean over +inf and NaN elements is NaN; the "
         "gradient stays finite")
    mb = np.where(np.isposinf(xb), 0.0, 1.0)
    case("bce-pos-inf-masked", {"name": "bce_with_logits", "pos_weight": pw},
         masked(lambda a: bce(a, T(yb), pos_weight=T(pw), reduction="none"), mb),
         xb, yb, out, mask=mb, call="F.binary_cross_entropy_with_logits(reduction='none') reduced by hand over a 0/1 "
         "float mask (torch.where)", desc="the +inf logits are masked out: finite value and gradient")


def pos_weight(out: Path, case: Callable, rng: np.random.Generator) -> None:
    """pos_weight broadcast against the prediction, as torch broadcasts it."""
    bce = F.binary_cross_entropy_with_logits
    x1, y1 = _logits(rng, 6), np.round(rng.uniform(0, 1, 6), 4)
    y1[:2] = [1.0, 0.0]
    case("bce-pos-weight-one-1d", {"name": "bce_with_logits", "pos_weight": [2.5]},
         lambda a: bce(a, T(y1), pos_weight=T([2.5], dtype=torch.float64)), x1, y1, out,
         call="F.binary_cross_entropy_with_logits(pos_weight=[2.5])",
         desc="one pos_weight for a 1-D prediction: torch broadcasts it to every element")
    x2, y2 = _logits(rng, 4, 3), np.round(rng.uniform(0, 1, (4, 3)), 4)
    case("bce-pos-weight-one-2d", {"name": "bce_with_logits", "pos_weight": [2.5]},
         lambda a: bce(a, T(y2), pos_weight=T([2.5], dtype=torch.float64)), x2, y2, out,
         call="F.binary_cross_entropy_with_logits(pos_weight=[2.5])", desc="one pos_weight for every class")
    case("bce-pos-weight-number", {"name": "bce_with_logits", "pos_weight": 0.5},
         lambda a: bce(a, T(y2), pos_weight=T(0.5, dtype=torch.float64)), x2, y2, out,
         call="F.binary_cross_entropy_with_logits(pos_weight=tensor(0.5))", desc="a 0-d pos_weight")
    x3, y3 = _logits(rng, 2, 3, 4), np.round(rng.uniform(0, 1, (2, 3, 4)), 4)
    pw3 = [[2.0], [0.5], [1.5]]
    case("bce-pos-weight-column-3d", {"name": "bce_with_logits", "pos_weight": pw3},
         lambda a: bce(a, T(y3), pos_weight=T(pw3, dtype=torch.float64)), x3, y3, out,
         call="F.binary_cross_entropy_with_logits(pos_weight of shape (3, 1))",
         desc="torch's documented [C, 1] form: one pos_weight per class of (N, C, L), broadcast along L")


def float_masks(out: Path, case: Callable, masked: Callable, rng: np.random.Generator) -> None:
    """Masks of 0/1 numbers select exactly as boolean masks do."""
    x, y = _logits(rng, 4, 3), _logits(rng, 4, 3)
    m = (rng.random((4, 3)) > 0.3).astype(np.float64)
    m[0, 0] = 1.0
    case("mse-float-mask", {"name": "mse"}, masked(lambda a: F.mse_loss(a, T(y), reduction="none"), m), x, y, out,
         mask=m, call="F.mse_loss(reduction='none') reduced by hand over the mask",
         desc="a 0/1 float mask: the mean over the elements marked 1")
    n, c = 6, 4
    xc, yc = _logits(rng, n, c), np.array([0, -100, 3, 1, 2, 2])
    w = np.round(rng.uniform(0.3, 2.0, c), 4)
    mc = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    valid = yc != -100
    cw = T(np.where(valid, w[np.where(valid, yc, 0)], 0.0))
    case("ce-float-mask-weight-ignore", {"name": "cross_entropy", "weight": w},
         masked(lambda a: F.cross_entropy(a, T(yc), weight=T(w), reduction="none"), mc, cw), xc, yc, out, mask=mc,
         call="F.cross_entropy(reduction='none') reduced by hand over the mask",
         desc="a 0/1 float token mask on top of ignore_index and class weights")
    xb, yb = _logits(rng, 3, 2), np.round(rng.uniform(0, 1, (3, 2)), 4)
    mi = np.array([[1, 0], [1, 1], [0, 1]])
    case("bce-int-mask", {"name": "bce_with_logits"},
         masked(lambda a: F.binary_cross_entropy_with_logits(a, T(yb), reduction="none"), mi), xb, yb, out, mask=mi,
         call="F.binary_cross_entropy_with_logits(reduction='none') reduced by hand over the mask",
         desc="an integer 0/1 mask (as a tokenizer's attention_mask) is read the same")


def focal(out: Path, case: Callable, masked: Callable, rng: np.random.Generator) -> None:
    """sigmoid_focal: torchvision's formula, its defaults alpha = 0.25, gamma = 2."""
    x = _logits(rng, 5, 3)
    y = (rng.random((5, 3)) > 0.6).astype(np.float64)
    call = FOCAL
    for red in ("mean", "sum", "none"):
        spec = {"name": "sigmoid_focal"} if red == "mean" else {"name": "sigmoid_focal", "reduction": red}
        case("focal-default" if red == "mean" else f"focal-{red}", spec,
             lambda a, red=red: sigmoid_focal_loss(a, T(y), reduction=red), x, y, out, call=call,
             desc=f"torchvision's defaults alpha = 0.25, gamma = 2; reduction '{red}'")
    for name, alpha, gamma, desc in [("focal-alpha-off", -1.0, 2.0, "alpha = -1: no alpha weighting"),
                                     ("focal-gamma-0", 0.5, 0.0, "gamma = 0: alpha-weighted bce"),
                                     ("focal-gamma-0.5", 0.75, 0.5, "gamma < 1"),
                                     ("focal-gamma-3", 0.1, 3.0, "gamma = 3")]:
        case(name, {"name": "sigmoid_focal", "alpha": alpha, "gamma": gamma},
             lambda a, alpha=alpha, gamma=gamma: sigmoid_focal_loss(a, T(y), alpha, gamma, "mean"), x, y, out,
             call=call, desc=desc)
    ys = np.round(rng.uniform(0, 1, (5, 3)), 4)
    case("focal-soft-targets", {"name": "sigmoid_focal", "alpha": 0.4, "gamma": 1.5},
         lambda a: sigmoid_focal_loss(a, T(ys), 0.4, 1.5, "mean"), x, ys, out, call=call,
         desc="targets in [0, 1], not only 0/1")
    w = np.round(rng.uniform(0.2, 2.0, 3), 4)
    case("focal-weight", {"name": "sigmoid_focal", "weight": w},
         lambda a: (sigmoid_focal_loss(a, T(y)) * T(w)).mean(), x, y, out, call=call + ", times weight",
         desc="weight multiplies each element (broadcast over the last axis), as for bce_with_logits")
    m = (rng.random((5, 3)) > 0.3).astype(np.float64)
    m[0, 0] = 1.0
    case("focal-mask", {"name": "sigmoid_focal", "gamma": 1.0},
         masked(lambda a: sigmoid_focal_loss(a, T(y), gamma=1.0), m), x, y, out, mask=m,
         call=call + ", reduced by hand over the 0/1 mask", desc="masked mean over the elements marked 1")
    case("focal-float32", {"name": "sigmoid_focal"}, lambda a: sigmoid_focal_loss(a, T(y, dtype=torch.float32),
         reduction="mean"), x, y, out, dtype="float32", call=call)
    # focal-extreme-logits: tools/gen_loss_edge_cases.py (mpmath), where torchvision's float formula is inexact


def sample_weights(out: Path, case: Callable, rng: np.random.Generator) -> None:
    """inputs.sample_weight: multiplies each sample's loss; the mean still divides by the count."""
    n, c = 6, 4
    x, y = _logits(rng, n, c), np.array([0, 3, -100, 1, 2, 2])
    s = np.round(rng.uniform(0, 2, n), 4)
    s[4] = 0.0
    w = np.round(rng.uniform(0.3, 2.0, c), 4)
    yv = np.where(y < 0, 0, y)
    ce = lambda tgt, **kw: (lambda a: F.cross_entropy(a, T(tgt), reduction="none", **kw))  # noqa: E731
    case("ce-sample-weight", {"name": "cross_entropy"}, weighted_mean(ce(yv), s), x, yv, out, sample_weight=s,
         call=f"F.cross_entropy(reduction='none') × sample_weight, {KERAS}",
         desc="Σ s·ℓ / N: a sample weight of 0 drops the sample's loss, not its count")
    valid = y != -100
    cw = T(np.where(valid, w[np.where(valid, y, 0)], 0.0))
    case("ce-sample-weight-class-weight-ignore", {"name": "cross_entropy", "weight": w, "label_smoothing": 0.1},
         weighted_mean(ce(y, weight=T(w), label_smoothing=0.1), s, count_w=cw), x, y, out, sample_weight=s,
         call=f"F.cross_entropy(weight, label_smoothing, reduction='none') × sample_weight, {KERAS}",
         desc="with class weights the count is Σ w_y over non-ignored targets, as torch's weighted mean")
    x3, y3 = _logits(rng, 2, c, 3), np.array([[0, 1, 2], [3, 3, 0]])
    s3, st = np.array([0.5, 2.0]), np.round(rng.uniform(0, 2, (2, 3)), 4)
    case("ce-sample-weight-3d-per-sample", {"name": "cross_entropy"}, weighted_mean(ce(y3), s3), x3, y3, out,
         sample_weight=s3, call=f"F.cross_entropy on (N, C, L) × sample_weight, {KERAS}",
         desc="one weight per sample, broadcast over L")
    case("ce-sample-weight-3d-per-token", {"name": "cross_entropy"}, weighted_mean(ce(y3), st), x3, y3, out,
         sample_weight=st, call=f"F.cross_entropy on (N, C, L) × sample_weight, {KERAS}",
         desc="one weight per token, shape (N, L)")
    xm, ym, sm = _logits(rng, 4, 3), _logits(rng, 4, 3), np.array([1.0, 0.25, 2.0, 0.0])
    for red in ("mean", "sum", "none"):
        spec = {"name": "mse"} if red == "mean" else {"name": "mse", "reduction": red}
        case(f"mse-sample-weight-{red}", spec, weighted_mean(lambda a: F.mse_loss(a, T(ym), reduction="none"), sm,
             reduction=red), xm, ym, out, sample_weight=sm, call=f"F.mse_loss(reduction='none') × sample_weight, {KERAS}",
             desc=f"per-row weights broadcast over the last axis; reduction '{red}'")
    xb, yb = _logits(rng, 4, 3), np.round(rng.uniform(0, 1, (4, 3)), 4)
    mb = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    pw = [2.0]
    case("bce-sample-weight-mask", {"name": "bce_with_logits", "pos_weight": pw},
         weighted_mean(lambda a: F.binary_cross_entropy_with_logits(a, T(yb), pos_weight=T(pw, dtype=torch.float64),
                                                                    reduction="none"), sm, mb), xb, yb, out,
         mask=mb, sample_weight=sm, call=f"F.binary_cross_entropy_with_logits(reduction='none') × sample_weight, {KERAS}",
         desc="the mean divides by the unmasked elements, whatever their sample weights")
    yf = (rng.random((4, 3)) > 0.5).astype(np.float64)
    case("focal-sample-weight", {"name": "sigmoid_focal"}, weighted_mean(lambda a: sigmoid_focal_loss(a, T(yf)), sm),
         xb, yf, out, sample_weight=sm, call=f"{FOCAL} × sample_weight, {KERAS}")
    lq = np.round(np.log(rng.dirichlet(np.ones(5), 4)), 4)
    p = np.round(rng.dirichlet(np.ones(5), 4), 4)
    case("kl-sample-weight-batchmean", {"name": "kl_div", "reduction": "batchmean"},
         lambda a: (F.kl_div(a, T(p), reduction="none") * T(sm)[:, None]).sum() / 4, lq, p, out, sample_weight=sm,
         call="F.kl_div(reduction='none') × sample_weight, summed and divided by the batch size (batchmean)")
