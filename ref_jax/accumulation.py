"""Gradient accumulation over a window of micro-batches, normalized once from sums and counts.

normalize = "micro_batches": each micro-batch backpropagates value_j / n, n the window's real size
(an incomplete last window is divided by its own count, seed 000's remainder correction);
normalize = "tokens": each backpropagates sum_j / N with N = Σ_j count_j known before the first
forward pass, so the window's gradient is the full-batch gradient (the 2024 accumulation fix).
See conformance.config.accumulation. The `accumulate` case model is linear: x @ w + b.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.errors import InputError
from conformance.rules.windows import check_window, host_total, prepare_windows
from ref_jax.backend import framework_dtype, to_numpy
from ref_jax.losses import compute_loss


class WindowOutput(NamedTuple):
    """One window's loss as backpropagated (normalized, before loss scaling, no gradient), the
    summed loss of its micro-batches, and the divisor (N for tokens, n for micro_batches)."""

    loss: Any
    sum: Any
    count: Any


def _window_size(window: Any) -> int:
    if isinstance(window, (list, tuple)):
        return len(window)
    leaves = jax.tree.leaves(window)
    if not leaves:
        raise InputError("the window holds no arrays")
    return int(leaves[0].shape[0])


def accumulate_gradients(
    spec: AccumulationSpec,
    loss_fn: Callable[[Any, Any], Any],
    params: Any,
    window: Any,
    counts: Any = None,
    scale_loss: Callable[[Any], Any] | None = None,
    reduce_count: Callable[[Any], Any] | None = None,
    no_sync: Callable[[], Any] | None = None,
) -> tuple[Any, WindowOutput]:
    """Gradients of one accumulation window, normalized once; returns (gradients, WindowOutput).

    loss_fn(params, micro_batch) -> LossOutput runs one micro-batch's forward pass (under autocast).
    `window` is a sequence of micro-batches (JAX also takes a pytree of arrays stacked on a leading
    axis: one lax.scan). micro_batches backpropagates value_j / n; tokens backpropagates sum_j / N,
    N = Σ counts (one count per micro-batch, from targets and masks before the forward pass);
    reduce_count(N) replaces N, e.g. all-reduced over data-parallel ranks and divided by the world
    size when DDP averages gradients. scale_loss multiplies each backpropagated loss (dynamic loss
    scaling). no_sync() is entered for every micro-batch but the last (DDP's model.no_sync).
    torch: gradients accumulate into each parameter's .grad (previous values are discarded) and are
    returned as {name: p.grad}; JAX: returned as a pytree like params (traceable inside jit)."""
    del no_sync  # gradients are reduced where the caller's sharding puts them, once per window
    n = _window_size(window)
    check_window(spec, n, counts)
    tokens = spec.normalize == "tokens"
    divisor: Any = float(n)
    if tokens:
        host = host_total(counts)
        total = jnp.asarray(host) if host is not None else jnp.sum(jnp.asarray(counts))
        divisor = reduce_count(total) if reduce_count is not None else total

    def part_fn(p: Any, mb: Any) -> tuple[Any, tuple[Any, Any]]:
        out = loss_fn(p, mb)
        part = out.sum / jnp.asarray(divisor).astype(out.sum.dtype) if tokens else out.value / n
        return (scale_loss(part) if scale_loss is not None else part), (part, out.sum)

    grad_fn = jax.grad(part_fn, has_aux=True)
    if isinstance(window, (list, tuple)):
        grads, loss, total_sum = None, 0.0, 0.0
        for mb in window:
            g, (part, s) = grad_fn(params, mb)
            # .grad += g order, as torch's AccumulateGrad
            grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
            loss, total_sum = loss + part, total_sum + s
    else:
        first = jax.tree.map(lambda x: x[0], window)
        _, (part_shape, sum_shape) = jax.eval_shape(part_fn, params, first)

        def body(carry: Any, mb: Any) -> tuple[Any, None]:
            acc, loss, total_sum = carry
            g, (part, s) = grad_fn(params, mb)
            return (jax.tree.map(jnp.add, acc, g), loss + part, total_sum + s), None

        init = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), part_shape.dtype),
                jnp.zeros((), sum_shape.dtype))
        (grads, loss, total_sum), _ = jax.lax.scan(body, init, window)
    return grads, WindowOutput(loss, total_sum, jnp.asarray(divisor))


def linear_forward(params: Any, x: Any) -> Any:
    """The `accumulate` case model: x @ w + b (torch: addmm, which autocast runs wholly in low precision)."""
    if x.dtype in (jnp.float16, jnp.bfloat16):
        # addmm accumulates in float32, adds the bias and rounds once; do the same
        acc = jnp.matmul(x, params["w"], preferred_element_type=jnp.float32)
        return (acc + params["b"].astype(jnp.float32)).astype(x.dtype)
    return x @ params["w"] + params["b"]


def _array(a: np.ndarray, dt: Any) -> Any:
    a = np.asarray(a)
    return jnp.asarray(a) if np.issubdtype(a.dtype, np.integer) or a.dtype == bool else jnp.asarray(
        a.astype(np.float64), dt)


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
    model = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in params.items()}

    def loss_fn(p: Any, mb: Any) -> Any:
        return compute_loss(loss_spec, linear_forward(p, mb["x"]), mb["y"], None, mb.get("mask"))

    out: dict[str, list[Any]] = {"grads": [], "loss": [], "count": []}
    for window in windows:
        batches = [{k: _array(v, dt) for k, v in mb.items()} for mb, _ in window]
        grads, res = accumulate_gradients(spec, loss_fn, model, batches, counts=[c for _, c in window])
        out["grads"].append({k: to_numpy(g) for k, g in grads.items()})
        out["loss"].append(float(res.loss))
        out["count"].append(float(res.count))
    return out
