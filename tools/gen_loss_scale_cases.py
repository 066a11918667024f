"""Write loss_scale conformance cases whose expected values come from GradScaler's equations,
checked against torch's own kernel.

    python tools/gen_loss_scale_cases.py [OUT_DIR]   # default: conformance/cases/loss_scale/generated

The expected trace is written from the rule of torch's `_amp_update_scale_` kernel (the one
`GradScaler.update()` calls; aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp): the scale is a
float32; an overflow multiplies it by `backoff_factor` in double and rounds to float32 and resets
the tracker; `growth_interval` finite updates in a row multiply it by `growth_factor` the same way,
kept only if the float32 result is finite, and reset the tracker. A non-finite update is skipped.
Every trace is then replayed through `torch._amp_update_scale_` itself and must agree bit for bit.
The `torch-native` backend drives a whole GradScaler with SGD as users do: a different path from
both of these, so it is graded, not copied. Never twinstep's code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conformance import tomlio

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "loss_scale" / "generated"
TORCH = f"torch {torch.__version__.split('+')[0]}"
DEFAULTS = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


def equations(finite: list[bool], args: dict[str, Any]) -> dict[str, list]:
    """The scale each update uses, whether it is skipped, and the tracker after the update."""
    a = {**DEFAULTS, **args}
    scale, tracker = np.float32(a["init_scale"]), 0
    out: dict[str, list] = {"scale": [], "skipped": [], "growth_tracker": []}
    for ok in finite:
        out["scale"].append(float(scale))
        out["skipped"].append(not ok)
        if not ok:
            # float * double is a double in C++; the store rounds it to float32
            scale, tracker = np.float32(float(scale) * a["backoff_factor"]), 0
        elif tracker + 1 == a["growth_interval"]:
            with np.errstate(over="ignore"):  # an overflow to inf is the case the kernel guards
                grown = np.float32(float(scale) * a["growth_factor"])
            scale, tracker = (grown if np.isfinite(grown) else scale), 0
        else:
            tracker += 1
        out["growth_tracker"].append(tracker)
    return out


def torch_kernel(finite: list[bool], args: dict[str, Any]) -> dict[str, list]:
    """The same trace from torch._amp_update_scale_, the kernel GradScaler.update() runs."""
    a = {**DEFAULTS, **args}
    scale = torch.full((), a["init_scale"], dtype=torch.float32)
    tracker = torch.zeros((), dtype=torch.int32)
    out: dict[str, list] = {"scale": [], "skipped": [], "growth_tracker": []}
    for ok in finite:
        out["scale"].append(scale.item())
        out["skipped"].append(not ok)
        found_inf = torch.full((), 0.0 if ok else 1.0)
        torch._amp_update_scale_(scale, tracker, found_inf, a["growth_factor"], a["backoff_factor"],
                                 a["growth_interval"])
        out["growth_tracker"].append(int(tracker.item()))
    return out


def write(name: str, finite: list[bool], precision: dict[str, Any], desc: str, out: Path) -> None:
    args = {k: v for k, v in precision.items() if k in DEFAULTS}
    got = equations(finite, args)
    if got != torch_kernel(finite, args):
        raise SystemExit(f"{name}: the equations and torch._amp_update_scale_ disagree")
    case = {
        "id": f"loss_scale/{name}", "kind": "loss_scale",
        "source": f"GradScaler's update equations (torch's _amp_update_scale_ kernel), checked bit for bit "
                  f"against {TORCH} torch._amp_update_scale_ (tools/gen_loss_scale_cases.py)",
        "description": desc, "precision": precision, "inputs": {"finite": finite},
        "expected": got, "tolerance": {"atol": 0.0, "rtol": 0.0},
    }
    (out / f"{name}.toml").write_text(tomlio.dumps(case))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261207)
    T, F = True, False
    write("defaults-early-overflows", [F, F, T, T, F, T, T], {"dtype": "float16"},
          "float16 turns dynamic scaling on; GradScaler's defaults back off 65536 -> 32768 -> 16384", out)
    write("growth-interval-3", [T, T, T, T, T, T, F, T, T, T, T],
          {"loss_scale": "dynamic", "init_scale": 4.0, "growth_interval": 3},
          "the scale doubles after every 3 finite updates; an overflow resets the tracker", out)
    write("no-floor", [F, F, F, F, T], {"loss_scale": "dynamic", "init_scale": 1.0},
          "no minimum scale: 1 -> 0.5 -> 0.25 -> 0.125 (jmp would stop at 1)", out)
    write("asymmetric-factors", [T, T, F, T, T, T, T, F, F, T, T],
          {"loss_scale": "dynamic", "init_scale": 8.0, "growth_factor": 3.0, "backoff_factor": 0.25,
           "growth_interval": 2},
          "growth 3, backoff 0.25: two factors (jmp has one)", out)
    write("inexact-factors", [T, F, T, F, F, T, T, T, F, T, F, T, T],
          {"loss_scale": "dynamic", "init_scale": 1000.0, "growth_factor": 1.1, "backoff_factor": 0.3,
           "growth_interval": 1},
          "factors not representable in float32: float32(float64(scale) * factor), as the kernel", out)
    write("growth-cap", [T, T, T, T], {"loss_scale": "dynamic", "init_scale": 2.0**126, "growth_interval": 1},
          "2^126 -> 2^127, then growth would overflow float32: the scale stays, the tracker resets", out)
    flags = [bool(x) for x in rng.random(40) > 0.3]
    write("random-40", flags, {"loss_scale": "dynamic", "init_scale": 256.0, "growth_interval": 4,
                               "max_consecutive_skips": 40},
          "40 updates with random overflows (p = 0.3), growth_interval 4", out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
