"""Write loss cases at the edges of floating point, with expected values from mathematics (mpmath, or
exact rational arithmetic for l1 / huber / smooth_l1 at tiny and zero residuals).

    python tools/gen_loss_edge_cases.py [OUT_DIR]      # default: conformance/cases/loss/edges

Expected values are 60-digit mpmath evaluations (tools/_mp_refs.py) rounded once to float64, never a
framework's float formula: at saturated logits torchvision's own sigmoid_focal_loss loses every digit
(1 − p_t by subtraction, σ(x) − y; its gradient is NaN for γ < 1, docs/divergences.md L-FOCAL).
Reduction "none" on a column (n, 1), so each element is compared on its own on every backend, and atol = 0: a pass cannot rest on an
absolute tolerance far above values of 1e-28 (issue: an honest witness, item 2). The rtol is a derived
bound, written into each case's description: the loss is a few exp/log terms and one power
exp(γ·log m); the power's relative error is about |γ·log m|·u plus a few u (u = 2^-53 in float64,
2^-24 in float32), with |log m| <= |x| + 1 at the case's logits.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import mpmath as mp

from conformance import tomlio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the references beside this script, however it is loaded
from _mp_refs import DIGITS, regression, sigmoid_focal  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "loss" / "edges"
SOURCE = (f"mpmath {mp.__version__} at {DIGITS} digits: torchvision.ops.sigmoid_focal_loss's mathematics "
          "(torchvision/ops/focal_loss.py, pytorch/vision@148ddaa) and its derivative (tools/gen_loss_edge_cases.py)")
U = {"float64": 2.0**-53, "float32": 2.0**-24}
FOCAL = [  # (name, dtype, gamma, alpha, logits, targets, what it shows)
    ("focal-extreme-logits", "float64", 2.0, 0.25,
     [30.0, -30.0, 5.0, -5.0, 30.0, -30.0],
     [1.0, 0.0, 1.0, 0.0, 0.0, 1.0],
     "torchvision's defaults at confident right (factor ~0, values ~1e-40) and confident wrong (factor ~1) logits"),
    ("focal-saturated-gamma-0.5", "float64", 0.5, 0.25,
     [20.0, 30.0, 40.0, -45.0, 36.5, -36.5, 300.0, -400.0, 3.0],
     [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0],
     "γ < 1 at confident logits, right (values down to 1e-272) and wrong: σ(x) rounds to 1 from x ≈ 37"),
    ("focal-saturated-soft-targets", "float64", 0.25, -1.0,
     [50.0, -50.0, 36.0, 12.0, -0.3, 0.0],
     [0.9, 0.1, 0.999, 0.5, 0.25, 1.0],
     "soft targets at saturated logits, γ = 0.25, no α weighting"),
    ("focal-saturated-float32", "float32", 0.5, 0.25,
     [12.0, 18.0, 20.0, 40.0, -45.0, 3.0, -17.0, 0.5],
     [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.3],
     "float32 from |x| ≈ 17 on: 1 − p_t by subtraction rounds to 0 there, which a literal formula turns "
     "into a 0 value and a NaN gradient"),
]


EXACT = ("exact rational arithmetic on the float64 inputs, rounded once: torch's l1_loss / huber_loss / "
         "smooth_l1_loss as mathematics, torch's slope 0 at a zero residual (tools/_mp_refs.py regression)")
REGRESSION = [  # (name, loss, parameter, predictions, targets, what it shows)
    ("l1-zero-residual", "l1", 1.0, [0.5, 2.0, -1.0, 3.0, 0.0], [0.5, 1.0, -1.0, 3.5, 0.0],
     "residuals of exactly 0 have slope 0 (torch's sign(0)); jnp.abs's derivative there is 1 (L-L1-ZERO)"),
    ("huber-tiny-residuals", "huber", 1.0, [1e-80, 1e-17, 0.5, 1.0, 3.0, -2.0], [0.0] * 6,
     "slope e inside δ down to e = 1e-80, δ·sign(e) at the knee: optax's huber_loss gradient q + δ − δ "
     "loses e below u·δ (L-HUBER-GRAD)"),
    ("smooth-l1-tiny-residuals", "smooth_l1", 0.5, [1e-80, 1e-17, 0.25, 0.5, 2.0], [0.0] * 5,
     "slope e/β inside β = 0.5 down to e = 1e-80, 1 at the knee (L-HUBER-GRAD through huber / β)"),
]


def regression_case(name: str, loss: str, param: float, x: list[float], y: list[float], what: str) -> dict[str, Any]:
    values, grads = zip(*((float(v), float(g)) for v, g, _, _ in (regression(loss, a, b, param) for a, b in zip(x, y))))
    extra = {"huber": {"delta": param}, "smooth_l1": {"beta": param}}.get(loss, {})
    return {
        "id": f"loss/{name}", "kind": "loss", "source": EXACT,
        "description": f"{what}. rtol 1e-15 (x − y and e²/2 each rounded once: 2u), atol 0: each value compared "
                       f"relatively, a 0 exactly",
        "loss": {"name": loss, "reduction": "none", **extra},
        "inputs": {"prediction": _column(x), "target": _column(y)},
        "expected": {"value": _column(values), "grad": _column(grads)},
        "tolerance": {"atol": 0.0, "rtol": 1e-15},
    }


def bound(dtype: str, gamma: float, logits: list[float]) -> float:
    """The derived rtol: (|γ|·(max |x| + 1) + 8)·u, rounded up to one significant digit."""
    raw = (abs(gamma) * (max(abs(v) for v in logits) + 1) + 8) * U[dtype]
    return float(f"{raw:.0e}") if float(f"{raw:.0e}") >= raw else float(f"{raw * 1.5:.0e}")


def focal_case(name: str, dtype: str, gamma: float, alpha: float, x: list[float], y: list[float],
               what: str) -> dict[str, Any]:
    values, grads = zip(*(sigmoid_focal(a, b, gamma, alpha) for a, b in zip(x, y)))
    rtol = bound(dtype, gamma, x)
    return {
        "id": f"loss/{name}", "kind": "loss", "source": SOURCE,
        "description": f"{what}. rtol {rtol:g} = (γ·(max|x| + 1) + 8)·u, atol 0: each value compared relatively",
        "dtype": dtype,
        "loss": {"name": "sigmoid_focal", "reduction": "none", "gamma": gamma, "alpha": alpha},
        "inputs": {"prediction": _column(x), "target": _column(y)},
        "expected": {"value": _column(values), "grad": _column(grads)},
        "tolerance": {"atol": 0.0, "rtol": rtol},
    }


def _column(v: Any) -> list[list[float]]:
    # one element per row: reduction "none" then means the same on backends that average the last axis
    # per sample (Keras, docs/divergences.md K-LASTAXIS)
    return [[float(a)] for a in v]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.toml"):
        old.unlink()
    for name, *rest in FOCAL:
        body = focal_case(name, *rest)
        if body["dtype"] == "float64":
            body.pop("dtype")
        (out / f"{name}.toml").write_text(tomlio.dumps(body))
    for name, *rest in REGRESSION:
        (out / f"{name}.toml").write_text(tomlio.dumps(regression_case(name, *rest)))
    print(f"wrote {len(FOCAL) + len(REGRESSION)} cases to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
