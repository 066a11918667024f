"""Gradient accumulation over a window of micro-batches, normalized once from sums and counts.

normalize = "micro_batches": each micro-batch backpropagates value_j / n, n the window's real size
(an incomplete last window is divided by its own count, so its gradient is its micro-batches' mean);
normalize = "tokens": each backpropagates sum_j / N with N = Σ_j count_j known before the first
forward pass, so the window's gradient is the full-batch gradient (the 2024 accumulation fix).
See conformance.config.accumulation. The `accumulate` case model is linear: x @ w + b.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.errors import InputError
from conformance.rules.inputs import element_shape
from conformance.rules.windows import check_window, prepare_windows
from ref_jax._window import WINDOW_ENTRIES, masked_loss, stack_window
from ref_jax.backend import framework_dtype, to_numpy
from ref_jax.losses import compute_loss

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
    del counts, no_sync  # the host layout summed the counts; sharding places the gradient reduction
    if not isinstance(window, Mapping) or any(k not in window for k in WINDOW_ENTRIES if k != "divisor"):
        raise InputError("the JAX accumulation loop takes a window laid out at one fixed shape "
                         "(ref_jax._window.stack_window), not a sequence of micro-batches")
    present = window["present"]
    steps = present.shape[0]
    if steps > spec.steps:
        raise InputError(f"the window has {steps} micro-batch slots; accumulation.steps = {spec.steps}")
    tokens = spec.normalize == "tokens"
    after = tokens and "divisor" not in window  # N from loss_fn's counts, divided at the end
    divisor = window["n"] if not tokens else (None if after else window["divisor"])
    if tokens and not after and reduce_count is not None:
        divisor = reduce_count(divisor)
    stateful = model_state is not None

    def part_fn(p: Any, mb: Any, st: Any) -> tuple[Any, tuple[Any, Any, Any, Any]]:
        out, st = loss_fn(p, mb, st) if stateful else (loss_fn(p, mb), st)
        if after:
            part = out.sum
        else:
            d = jnp.asarray(divisor).astype(out.sum.dtype)
            part = out.sum / d if tokens else out.value / d
        aux = (part, out.sum, jnp.asarray(out.count).astype(out.sum.dtype), st)
        return (scale_loss(part) if scale_loss is not None else part), aux

    grad_fn = jax.grad(part_fn, has_aux=True)
    batches = {k: v for k, v in window.items() if k not in WINDOW_ENTRIES}
    batches["j"] = jnp.arange(steps, dtype=jnp.int32)
    first = jax.tree.map(lambda a: a[0], batches)
    _, (part_shape, sum_shape, _, _) = jax.eval_shape(part_fn, params, first, model_state)
    zero = jnp.zeros((), sum_shape.dtype)
    zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), part_shape.dtype), zero, zero)

    def body(carry: Any, xs: Any) -> tuple[Any, None]:
        mb, real = xs
        acc, loss, total, count, st = carry

        def run(st: Any) -> Any:
            g, (part, s, c, st) = grad_fn(params, mb, st)
            return (g, part, s, c), st

        (g, part, s, c), st = jax.lax.cond(real, run, lambda st: (zeros, st), st)
        return (jax.tree.map(jnp.add, acc, g), loss + part, total + s, count + c, st), None

    (grads, loss, total, count, state), _ = jax.lax.scan(body, (*zeros, model_state), (batches, present))
    if after:
        divisor = reduce_count(count) if reduce_count is not None else count
        grads = jax.tree.map(lambda g: g / divisor.astype(g.dtype), grads)
        loss = loss / divisor.astype(loss.dtype)
    return grads, WindowOutput(loss, total, jnp.asarray(divisor), state)


def linear_forward(params: Any, x: Any) -> Any:
    """The `accumulate` case model: x @ w + b (torch: addmm, which autocast runs wholly in low precision)."""
    if x.dtype in (jnp.float16, jnp.bfloat16):
        # addmm accumulates in float32, adds the bias and rounds once; do the same
        acc = jnp.matmul(x, params["w"], preferred_element_type=jnp.float32)
        return (acc + params["b"].astype(jnp.float32)).astype(x.dtype)
    return x @ params["w"] + params["b"]


def _micro_batch(loss_spec: LossSpec, mb: Mapping[str, np.ndarray], dt: Any, d_out: int) -> dict[str, np.ndarray]:
    """A case micro-batch as the loop's entries: floats in the case dtype, and "valid", its
    element mask (all True without one), which the padding rows extend with False."""
    x = np.asarray(mb["x"], np.float64).astype(dt)
    y = np.asarray(mb["y"])
    if not (np.issubdtype(y.dtype, np.integer) or y.dtype == bool):
        y = y.astype(np.float64).astype(dt)
    mask = mb.get("mask")
    if mask is None:
        mask = np.ones(element_shape(loss_spec, np.zeros((x.shape[0], d_out)), y), bool)
    return {"x": x, "y": y, "valid": np.asarray(mask, bool)}


@functools.partial(jax.jit, static_argnums=(0, 1))
def _linear_window(loss_json: str, spec_json: str, params: Any, window: Any) -> tuple[Any, WindowOutput]:
    # the specs as JSON (hashable, unlike specs with list fields): equal cases share one compile
    loss_spec, spec = LossSpec.model_validate_json(loss_json), AccumulationSpec.model_validate_json(spec_json)

    def loss_fn(p: Any, mb: Any) -> Any:
        out = compute_loss(loss_spec, linear_forward(p, mb["x"]), mb["y"], None, mb["valid"])
        return masked_loss(loss_spec, out, jnp.sum(mb["mask"]))

    return accumulate_gradients(spec, loss_fn, params, window)


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
    dt = np.dtype(framework_dtype(dtype))
    model = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in params.items()}
    d_out = model["w"].shape[1]
    rows = max(np.shape(mb["x"])[0] for window in windows for mb, _ in window)  # one shape, one compile
    specs = (loss_spec.model_dump_json(), spec.model_dump_json())
    out: dict[str, list[Any]] = {"grads": [], "loss": [], "count": []}
    for window in windows:
        batches = [_micro_batch(loss_spec, mb, dt, d_out) for mb, _ in window]
        grads, res = _linear_window(*specs, model, stack_window(batches, [c for _, c in window], spec.steps, dt, rows))
        out["grads"].append({k: to_numpy(g) for k, g in grads.items()})
        out["loss"].append(float(res.loss))
        out["count"].append(float(res.count))
    return out
