"""Gradient accumulation in NumPy float64, from the equations (see conformance.config.accumulation).

The `accumulate` case model is linear: prediction = x @ w + b, params {w: (d_in, d_out), b: (d_out,)}.
For a window of n micro-batches with loss outputs (value_j, sum_j, count_j):

    micro_batches:  L = (1/n) Σ_j value_j             tokens:  L = Σ_j sum_j / N,  N = Σ_j count_j

and by the chain rule, with u_j = dL/dprediction_j,  dL/dw = Σ_j x_jᵀ u_j,  dL/db = Σ_j Σ_rows u_j.

The host-side part every backend shares (input checks, counts, windows) is
conformance.rules.windows.prepare_windows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.errors import InputError
from conformance.oracle.losses import loss_value_and_grad
from conformance.rules.windows import Batch, prepare_windows


def _grad(loss_spec: LossSpec, spec: AccumulationSpec, params: Mapping[str, np.ndarray],
          window: list[tuple[Batch, float]]) -> tuple[dict[str, np.ndarray], float, float]:
    w = np.asarray(params["w"], np.float64)
    b = np.asarray(params["b"], np.float64)
    n = len(window)
    total = float(sum(c for _, c in window))
    gw, gb = np.zeros_like(w), np.zeros_like(b)
    loss = 0.0
    for mb, _ in window:
        x = np.asarray(mb["x"], np.float64)
        y = np.asarray(mb["y"])
        y = y if np.issubdtype(y.dtype, np.integer) else y.astype(np.float64)
        pred = x @ w + b
        if spec.normalize == "tokens":
            out = loss_value_and_grad(loss_spec.model_copy(update={"reduction": "sum"}), pred, y, None, mb.get("mask"))
            u, part = out["grad"] / total, out["sum"] / total
        else:
            out = loss_value_and_grad(loss_spec, pred, y, None, mb.get("mask"))
            u, part = out["grad"] / n, float(out["value"]) / n
        gw += x.T @ u
        gb += u.sum(axis=0)
        loss += part
    return {"w": gw, "b": gb}, loss, (total if spec.normalize == "tokens" else float(n))


def window_gradients(
    loss_spec: LossSpec,
    spec: AccumulationSpec,
    params: dict[str, np.ndarray],
    micro_batches: list[dict[str, np.ndarray]],
    dtype: str = "float64",
) -> dict[str, Any]:
    """Accumulated gradients of the linear model over each window of `micro_batches`.

    Returns {"grads": [{w, b} per window], "loss": [per window], "count": [the divisor per
    window]} as float64 NumPy."""
    windows = prepare_windows(loss_spec, spec, params, micro_batches)
    out: dict[str, list[Any]] = {"grads": [], "loss": [], "count": []}
    for window in windows:
        grads, loss, count = _grad(loss_spec, spec, params, window)
        out["grads"].append(grads)
        out["loss"].append(loss)
        out["count"].append(count)
    return out


def full_batch_gradients(loss_spec: LossSpec, params: dict[str, np.ndarray],
                         micro_batches: list[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
    """The gradient and loss of one batch made of all `micro_batches` concatenated (no accumulation)."""
    whole: dict[str, np.ndarray] = {}
    for key in ("x", "y", "mask"):
        parts = [np.asarray(mb[key]) for mb in micro_batches if key in mb]
        if parts and len(parts) != len(micro_batches):
            raise InputError(f"{key} is given for some micro-batches only")
        if parts:
            whole[key] = np.concatenate(parts, axis=0)
    res = window_gradients(loss_spec, AccumulationSpec(steps=1), params, [whole])
    return res["grads"][0], res["loss"][0]
