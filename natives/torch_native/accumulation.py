"""Plain gradient accumulation in torch: every micro-batch's loss divided once and backpropagated
into `.grad`, which sums them (torch's documented idiom, `(loss / n).backward()`).

normalize = "micro_batches": loss_j (torch's reduction, masked by hand) / n, n the window's real
size; "tokens": loss_j with reduction="sum" / N, N the window's count of elements torch's mean
would divide by (non-ignored targets, weighted by their class weight; masked elements left out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from conformance.config import AccumulationSpec, LossSpec
from conformance.rules.windows import prepare_windows
from natives._protocol import window_slices
from natives.torch_native.backend import dtype_of, to_numpy
from natives.torch_native.losses import functional, masked, targets


def window_gradients(loss_spec: LossSpec, spec: AccumulationSpec, params: Mapping[str, np.ndarray],
                     micro_batches: Sequence[Mapping[str, Any]], dtype: str = "float64") -> dict[str, Any]:
    """Accumulated gradients (and window losses) of the linear model x @ w + b over each window."""
    prepare_windows(loss_spec, spec, params, micro_batches)  # host-side input checks (InputError)
    dt = dtype_of(dtype)
    w = torch.nn.Parameter(torch.tensor(np.asarray(params["w"], np.float64), dtype=dt))
    b = torch.nn.Parameter(torch.tensor(np.asarray(params["b"], np.float64), dtype=dt))
    summed = loss_spec.model_copy(update={"reduction": "sum"})

    def loss(mb: Mapping[str, Any], spec_: LossSpec) -> tuple[torch.Tensor, torch.Tensor]:
        pred = torch.tensor(np.asarray(mb["x"], np.float64), dtype=dt) @ w + b
        t, cw = targets(spec_, mb["y"], None, dt)
        if mb.get("mask") is None and spec_.reduction != "sum":
            return functional(spec_, pred, t, cw, spec_.reduction), torch.tensor(1.0)
        value, _, count = masked(spec_, pred, t, cw, mb.get("mask"))
        return value, count

    out: dict[str, list[Any]] = {"grads": [], "loss": []}
    for window in window_slices(len(micro_batches), spec.steps, spec.last_window == "drop"):
        w.grad = b.grad = None
        batches = [micro_batches[j] for j in window]
        if spec.normalize == "tokens":
            with torch.no_grad():
                total = sum(float(loss(mb, summed)[1]) for mb in batches)
        value = 0.0
        for mb in batches:
            part = loss(mb, summed)[0] / total if spec.normalize == "tokens" else loss(mb, loss_spec)[0] / len(batches)
            part.backward()
            value += part.item()
        out["grads"].append({"w": to_numpy(w.grad), "b": to_numpy(b.grad)})
        out["loss"].append(value)
    return out
