"""torch.amp.GradScaler's update rule, driven as in training: one float32 parameter and SGD, an inf
gradient for a non-finite update (the loss times inf), `scaler.step`, `scaler.update`.

GradScaler has no limit on consecutive skips and no raise policy: a trace that reaches
`max_consecutive_skips`, and on_nonfinite = "raise", are unsupported.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.config import PrecisionSpec
from conformance.rules.loss_scale import require_dynamic_scaling
from natives._protocol import refuse, require


def loss_scale_trace(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict[str, Any]:
    """The scale in force at each update, whether GradScaler skipped it, and its growth tracker."""
    require_dynamic_scaling(spec)
    run = longest = 0
    for ok in finite:
        run = 0 if ok else run + 1
        longest = max(longest, run)
    if spec.max_consecutive_skips is not None and longest > spec.max_consecutive_skips:
        raise refuse(f"precision.max_consecutive_skips = {spec.max_consecutive_skips} with {longest} skips in a row",
                     "torch.amp.GradScaler has no limit on consecutive skips")
    require(spec, "precision", "on_nonfinite", ("skip",), "torch.amp.GradScaler (it always skips)")
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float32))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=spec.init_scale, growth_factor=spec.growth_factor,
                                  backoff_factor=spec.backoff_factor, growth_interval=spec.growth_interval)
    out: dict[str, list[Any]] = {"scale": [], "skipped": [], "growth_tracker": []}
    for ok in finite:
        opt.zero_grad(set_to_none=True)
        scaler.scale((p * p).sum() * (1.0 if ok else float("inf"))).backward()
        out["scale"].append(scaler.get_scale())
        before = p.detach().clone()
        scaler.step(opt)
        out["skipped"].append(bool(torch.equal(before, p.detach())))
        scaler.update()
        out["growth_tracker"].append(int(scaler.state_dict()["_growth_tracker"]))
    return out
