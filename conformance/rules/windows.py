"""Accumulation windows: the host-side rules every backend shares before any forward pass.

- `prepare_windows`: check every micro-batch of an `accumulate` case (one InputError naming the
  micro-batch), count its valid elements (the divisor of normalize = "tokens", known before the
  forward pass) and split the micro-batches into windows (the incomplete last one kept or dropped);
- `check_window`: whether one window of `size` micro-batches with these counts can be accumulated;
- `host_total`: the window's total count when the counts are plain numbers (None for device arrays,
  which are not synchronized to check them).

The `accumulate` case model is linear: prediction = x @ w + b, params {w: (d_in, d_out), b: (d_out,)}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.errors import InputError
from conformance.rules.inputs import check_finite, check_loss_inputs, valid_count

Batch = Mapping[str, np.ndarray]


def _shape_check(params: Mapping[str, np.ndarray], j: int, mb: Batch) -> tuple[int, int]:
    if set(params) != {"w", "b"}:
        raise InputError(f"the linear model takes params w and b; received {sorted(params)}")
    w, b = np.asarray(params["w"]), np.asarray(params["b"])
    if w.ndim != 2 or b.shape != (w.shape[1],):
        raise InputError(f"linear params must be w (d_in, d_out) and b (d_out,); received w {w.shape}, b {b.shape}")
    missing = {"x", "y"} - set(mb)
    if missing:
        raise InputError(f"micro_batches[{j}] needs x and y; missing {sorted(missing)}")
    x = np.asarray(mb["x"])
    if x.ndim != 2 or x.shape[1] != w.shape[0]:
        raise InputError(f"micro_batches[{j}].x must have shape (rows, {w.shape[0]}); received {x.shape}")
    return x.shape[0], w.shape[1]


def prepare_windows(
    loss_spec: LossSpec, spec: AccumulationSpec, params: Mapping[str, np.ndarray], micro_batches: Sequence[Batch]
) -> list[list[tuple[Batch, float]]]:
    """Check every micro-batch on the host and split them into windows of (micro-batch, count).

    The incomplete last window is kept (last_window = "update") or left out ("drop")."""
    spec.check_loss(loss_spec.reduction)
    if not micro_batches:
        raise InputError("micro_batches is empty; an accumulation window needs at least one")
    # tokens normalization sums per-element losses, so a micro-batch may have no valid element
    check_spec = loss_spec.model_copy(update={"reduction": "sum"}) if spec.normalize == "tokens" else loss_spec
    counted: list[tuple[Batch, float]] = []
    for j, mb in enumerate(micro_batches):
        rows, d_out = _shape_check(params, j, mb)
        placeholder = np.zeros((rows, d_out))
        mask = mb.get("mask")
        try:
            check_finite("x", np.asarray(mb["x"], np.float64))
            check_loss_inputs(check_spec, placeholder, np.asarray(mb["y"]), None, mask)
        except InputError as exc:
            raise InputError(f"micro_batches[{j}]: {exc}") from None
        counted.append((mb, valid_count(loss_spec, placeholder, np.asarray(mb["y"]), None, mask)))
    windows: list[list[tuple[Batch, float]]] = []
    start = 0
    for i, size in enumerate(spec.windows(len(counted))):
        window = counted[start:start + size]
        start += size
        if spec.normalize == "tokens" and sum(c for _, c in window) == 0:
            raise InputError(f"accumulation window {i} has no valid elements (every target is masked or "
                             "ignored); normalize = 'tokens' would divide by 0")
        windows.append(window)
    return windows


def host_total(counts: Any) -> float | None:
    # counts given as plain numbers can be checked on the host; framework arrays are not synced
    if isinstance(counts, np.ndarray) or (isinstance(counts, (list, tuple)) and all(
            isinstance(c, (int, float, np.integer, np.floating)) for c in counts)):
        return float(np.sum(np.asarray(counts, np.float64)))
    return None


def check_window(spec: AccumulationSpec, size: int, counts: Any) -> None:
    """Raise InputError if a window of `size` micro-batches (with these counts) cannot be accumulated."""
    if size < 1:
        raise InputError("an accumulation window needs at least one micro-batch")
    if size > spec.steps:
        raise InputError(f"the window has {size} micro-batches; accumulation.steps = {spec.steps}")
    if spec.normalize != "tokens":
        return
    if counts is None:
        raise InputError("accumulation.normalize = 'tokens' needs counts: the valid elements of each "
                         "micro-batch, known before the forward pass (conformance.rules.inputs.valid_count)")
    if len(counts) != size:
        raise InputError(f"counts has {len(counts)} entries for a window of {size} micro-batches")
    total = host_total(counts)
    if total is not None and total == 0:
        raise InputError("the accumulation window has no valid elements (every target is masked or ignored); "
                         "normalize = 'tokens' would divide by 0")
