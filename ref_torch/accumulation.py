"""Gradient accumulation over a window of micro-batches, normalized once from sums and counts.

normalize = "micro_batches": each micro-batch backpropagates value_j / n, n the window's real size
(an incomplete last window is divided by its own count, so its gradient is its micro-batches' mean);
normalize = "tokens": each backpropagates sum_j / N with N = Σ_j count_j known before the first
forward pass, so the window's gradient is the full-batch gradient (the 2024 accumulation fix).
See conformance.config.accumulation. The `accumulate` case model is linear: x @ w + b.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.errors import InputError
from conformance.rules.windows import check_window, prepare_windows
from ref_torch.backend import framework_dtype, to_numpy
from ref_torch.losses import compute_loss

__all__ = ["WindowOutput", "accumulate_gradients", "check_window", "linear_forward", "window_gradients"]


class WindowOutput(NamedTuple):
    """One window's loss as backpropagated (normalized, before loss scaling, no gradient), the
    summed loss of its micro-batches, the divisor (N for tokens, n for micro_batches) and the
    model state after the window (None without one)."""

    loss: Any
    sum: Any
    count: Any
    model_state: Any = None


def accumulate_gradients(
    spec: AccumulationSpec,
    loss_fn: Callable[[Any, Any], Any],
    params: Any,
    window: Any,
    counts: Any = None,
    scale_loss: Callable[[Any], Any] | None = None,
    reduce_count: Callable[[Any], Any] | None = None,
    no_sync: Callable[[], Any] | None = None,
    model_state: Any = None,
) -> tuple[Any, WindowOutput]:
    """Gradients of one accumulation window, normalized once; returns (gradients, WindowOutput).

    loss_fn(params, micro_batch) -> LossOutput runs one micro-batch's forward pass (under autocast).
    micro_batches backpropagates value_j / n; tokens backpropagates sum_j / N, N = Σ counts (one
    count per micro-batch, from targets and masks before the forward pass); reduce_count(N) replaces
    N, e.g. all-reduced over data-parallel ranks and divided by the world size when DDP averages
    gradients. Tokens with counts unknown before the forward pass (a user's loss_fn: torch counts
    None, JAX a window without "divisor"): each micro-batch backpropagates sum_j and the summed
    gradients are divided once by N = Σ of the counts loss_fn returned (reduce_count applied),
    the same gradient up to rounding. scale_loss multiplies each backpropagated loss (dynamic loss
    scaling). no_sync() is entered for every micro-batch but the last (DDP's model.no_sync).
    model_state (JAX): the model's non-trainable state (BatchNorm statistics, NNX RNG counters);
    then loss_fn(params, micro_batch, model_state) -> (LossOutput, model_state), the state threads
    through the micro-batches in order and WindowOutput.model_state is the state after the window
    (torch modules update their buffers in place: it is returned as given).
    torch: `window` is a sequence of micro-batches; gradients accumulate into each parameter's .grad
    (previous values are discarded) and are returned as {name: p.grad}.
    JAX: `window` is laid out on the host at one fixed shape (ref_jax._window.stack_window: each
    micro-batch entry stacked on a leading axis of at most accumulation.steps, "present" marking the
    real micro-batches, "n" their number, "divisor" N; counts and no_sync are not read), so one
    compiled loop serves every window: lax.scan adds the gradients in micro-batch order (as torch's
    .grad +=), an absent micro-batch not even computed (lax.cond); loss_fn's micro-batch also holds
    "j", its index in the window; gradients are returned as a pytree like params (traceable in jit)."""
    if type(params) is not dict and not isinstance(params, Mapping):
        raise InputError("params must be a mapping of name -> parameter, e.g. dict(model.named_parameters())")
    micro = window if type(window) in (list, tuple) else list(window)
    n = len(micro)
    tokens = spec.normalize == "tokens"
    after = tokens and counts is None  # N from loss_fn's counts, divided at the end
    check_window(spec.model_copy(update={"normalize": "micro_batches"}) if after else spec, n, counts)
    for p in params.values():
        p.grad = None
    divisor: Any = float(n)
    if tokens and not after:
        # counts known on the host stay a host number: a tensor made from it would be copied to the
        # accelerator from pageable memory, which waits for the device
        total = counts.sum() if isinstance(counts, torch.Tensor) else float(
            np.sum(np.asarray([float(c) for c in counts], np.float64)))
        divisor = reduce_count(torch.as_tensor(total, dtype=torch.float64)) if reduce_count is not None else total
    divide: Any = None  # the divisor as a tensor on the loss's device and in its dtype (tokens)
    parts: list[Any] = []
    sums: list[Any] = []
    counts_seen: list[Any] = []
    last = n - 1
    for j, mb in enumerate(micro):
        with no_sync() if (no_sync is not None and j < last) else _NO_CONTEXT:
            out = loss_fn(params, mb)
            if after:
                part = out.sum
                counts_seen.append(out.count)
            elif tokens:
                if divide is None:
                    divide = (torch.full((), divisor, dtype=torch.float64, device=out.sum.device) if
                              isinstance(divisor, float) else divisor.to(out.sum.device)).to(out.sum.dtype)
                part = out.sum / divide
            else:
                part = out.value / n
            (scale_loss(part) if scale_loss is not None else part).backward()
        parts.append(part)
        sums.append(out.sum)
    # the totals, summed in micro-batch order (a left fold, as .grad accumulates), outside the graph
    loss_total, sum_total = _fold(parts), _fold(sums)
    if after:
        total = _fold([c.to(torch.float64) for c in counts_seen])
        divisor = reduce_count(total) if reduce_count is not None else total
        with torch.no_grad():
            for p in params.values():
                if p.grad is not None:
                    p.grad.div_(divisor.to(p.grad.dtype))
        loss_total = loss_total / divisor.to(loss_total.dtype)
    count = divisor if isinstance(divisor, torch.Tensor) else torch.tensor(divisor, dtype=torch.float64)
    grads = dict(zip(params, map(_GRAD, params.values())))  # {name: p.grad}
    return grads, WindowOutput(loss_total, sum_total, count, model_state)


_NO_CONTEXT = contextlib.nullcontext()  # reusable: nullcontext holds no state
_GRAD = operator.attrgetter("grad")


def _fold(values: list[Any]) -> Any:
    # detached terms: the sum records no graph (cheaper than entering torch.no_grad())
    total = values[0].detach()
    for v in values[1:]:
        total = total + v.detach()
    return total


def linear_forward(params: Any, x: Any) -> Any:
    """The `accumulate` case model: x @ w + b (torch: addmm, which autocast runs wholly in low precision)."""
    return torch.addmm(params["b"], x, params["w"])


def _tensor(a: np.ndarray, dt: Any) -> Any:
    a = np.asarray(a)
    return torch.tensor(a) if np.issubdtype(a.dtype, np.integer) or a.dtype == bool else torch.tensor(
        a.astype(np.float64), dtype=dt)


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
    dt = framework_dtype(dtype)
    model = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64), dtype=dt)) for k, v in params.items()}

    def loss_fn(p: Any, mb: Any) -> Any:
        return compute_loss(loss_spec, linear_forward(p, mb["x"]), mb["y"], None, mb.get("mask"))

    out: dict[str, list[Any]] = {"grads": [], "loss": [], "count": []}
    for window in windows:
        batches = [{k: _tensor(v, dt) for k, v in mb.items()} for mb, _ in window]
        grads, res = accumulate_gradients(spec, loss_fn, model, batches, counts=[c for _, c in window])
        out["grads"].append({k: to_numpy(g) for k, g in grads.items()})
        out["loss"].append(float(res.loss))
        out["count"].append(float(res.count))
    return out
