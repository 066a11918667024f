"""Write loss_scale conformance cases whose expected values come from a real torch.amp.GradScaler.

    python tools/gen_loss_scale_cases.py [OUT_DIR]   # default: conformance/cases/loss_scale/generated

Each case drives torch.amp.GradScaler("cpu") with one float32 parameter and SGD: a non-finite
update gets an inf gradient (the loss is multiplied by inf), a finite one a finite gradient. The
expected `scale` is scaler.get_scale() before scaler.update() (the scale the update used),
`skipped` whether SGD left the parameter untouched, `growth_tracker` scaler.state_dict()'s
"_growth_tracker" after update(). Never twinstep's code.
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


def run_grad_scaler(finite: list[bool], args: dict[str, Any]) -> dict[str, list]:
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **{k: args.get(k, v) for k, v in DEFAULTS.items()})
    out: dict[str, list] = {"scale": [], "skipped": [], "growth_tracker": []}
    for ok in finite:
        opt.zero_grad(set_to_none=True)
        loss = (p * p).sum() * (1.0 if ok else float("inf"))
        scaler.scale(loss).backward()
        out["scale"].append(scaler.get_scale())
        before = p.detach().clone()
        scaler.step(opt)
        out["skipped"].append(bool(torch.equal(before, p.detach())))
        scaler.update()
        out["growth_tracker"].append(int(scaler.state_dict()["_growth_tracker"]))
    return out


def write(name: str, finite: list[bool], precision: dict[str, Any], desc: str, out: Path) -> None:
    args = {k: v for k, v in precision.items() if k in DEFAULTS}
    got = run_grad_scaler(finite, args)
    if got["skipped"] != [not f for f in finite]:
        raise SystemExit(f"{name}: GradScaler skipped {got['skipped']} for finite = {finite}")
    case = {
        "id": f"loss_scale/{name}", "kind": "loss_scale",
        "source": f"{TORCH} torch.amp.GradScaler('cpu') run with injected inf gradients "
                  "(tools/gen_loss_scale_cases.py)",
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
