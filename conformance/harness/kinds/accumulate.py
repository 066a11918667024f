"""kind = "accumulate": gradients of a window of micro-batches, accumulated and normalized once.

    [loss]          the loss (reduction "mean", "sum" or "batchmean")
    [accumulation]  steps, normalize, last_window
    [inputs]        model = "linear"   (prediction = x @ w + b)
                    params = { w = [[...]], b = [...] }       w: (d_in, d_out), b: (d_out,)
                    micro_batches = [ { x = [[...]], y = [...], mask = [...] }, ... ]
    [expected]      grads = { w, b } (one window) or [ {w, b}, ... ] (one per window),
                    optional loss (one number per window), or equals = "full_batch"

The micro-batches form windows of `steps` (the last one incomplete unless last_window = "drop").
`equals = "full_batch"` compares each window's gradient (and loss) with the gradient of one batch
made of its micro-batches concatenated, computed by the NumPy oracle without accumulation; it
holds for normalize = "tokens", or for "micro_batches" when every micro-batch has the same count.
Calls `accumulation.window_gradients(loss_spec, spec, params, micro_batches, dtype)`.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from conformance.errors import ConfigError
from conformance.harness.arrays import Array, CaseTable, round_to
from conformance.harness.backends import Backend
from conformance.harness.case import Case
from conformance.oracle.accumulation import full_batch_gradients
from conformance.rules.windows import prepare_windows

REQUIRED_SECTIONS = ("loss", "accumulation")


class MicroBatch(CaseTable):
    x: Array
    y: Array
    mask: Array | None = None


class Inputs(CaseTable):
    model: Literal["linear"] = "linear"
    params: dict[str, Array]
    micro_batches: list[MicroBatch] = Field(min_length=1)


class Expected(CaseTable):
    grads: dict[str, Array] | list[dict[str, Array]] | None = None
    loss: float | list[float] | None = None
    equals: Literal["full_batch"] | None = None


def _as_list(value: Any) -> list[Any] | None:
    return None if value is None else (value if isinstance(value, list) else [value])


def arrays(case: Case) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """Params and micro-batches as NumPy, floats rounded to the case dtype (the same on every backend)."""
    index_target = case.sections["loss"].name in ("cross_entropy", "nll")
    params = {k: round_to(v.astype(np.float64), case.dtype) for k, v in case.inputs.params.items()}
    batches = []
    for mb in case.inputs.micro_batches:
        y = mb.y
        if not (index_target and np.issubdtype(y.dtype, np.integer)):
            y = round_to(y.astype(np.float64), case.dtype)
        batch = {"x": round_to(mb.x.astype(np.float64), case.dtype), "y": y}
        if mb.mask is not None:
            batch["mask"] = mb.mask
        batches.append(batch)
    return params, batches


def check_case(case: Case) -> None:
    exp, spec, loss = case.expected, case.sections["accumulation"], case.sections["loss"]
    if (exp.grads is None) == (exp.equals is None):
        raise ValueError("expected needs either grads or equals = 'full_batch' (not both)")
    try:
        spec.check_loss(loss.reduction)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    params, batches = arrays(case)
    windows = prepare_windows(loss, spec, params, batches)
    grads = _as_list(exp.grads)
    if grads is not None and len(grads) != len(windows):
        raise ValueError(f"expected.grads has {len(grads)} parameter sets; the micro-batches form "
                         f"{len(windows)} windows")
    losses = _as_list(exp.loss)
    if losses is not None and len(losses) != len(windows):
        raise ValueError(f"expected.loss has {len(losses)} values; the micro-batches form {len(windows)} windows")
    if exp.equals == "full_batch" and spec.normalize == "micro_batches":
        for i, window in enumerate(windows):
            if len({c for _, c in window}) > 1:
                raise ValueError(f"equals = 'full_batch' needs normalize = 'tokens' or equal counts per "
                                 f"micro-batch; window {i} has counts {[c for _, c in window]}")


def run(case: Case, backend: Backend) -> dict[str, Any]:
    fn = backend.function("accumulation", "window_gradients")
    params, batches = arrays(case)
    out = fn(case.sections["loss"], case.sections["accumulation"], params, batches, dtype=case.dtype)
    if case.expects_error:
        return out
    return {k: out[k] for k in expected_values(case)}


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    if exp.equals == "full_batch":
        params, batches = arrays(case)
        windows = prepare_windows(case.sections["loss"], case.sections["accumulation"], params, batches)
        grads, losses = [], []
        for window in windows:
            g, value = full_batch_gradients(case.sections["loss"], params, [mb for mb, _ in window])
            grads.append(g)
            losses.append(value)
        return {"grads": grads, "loss": losses}
    want: dict[str, Any] = {"grads": [{k: v.astype(np.float64) for k, v in g.items()} for g in _as_list(exp.grads)]}
    if exp.loss is not None:
        want["loss"] = _as_list(exp.loss)
    return want
