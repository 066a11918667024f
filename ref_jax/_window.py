"""Accumulation windows laid out at one fixed shape, so the JAX train step compiles once.

Host side: `WindowLayout.pad(window)` turns a conformance.data.Window (up to accumulation.steps
micro-batches of up to data.batch_size samples each) into NumPy arrays of fixed shape

    x [steps, rows, ...]  y [steps, rows, ...]  mask [steps, rows]  present [steps]
    n (real micro-batches)  divisor (Σ valid counts of the window, for normalize = "tokens")

where `rows` is the micro-batch size rounded up to a multiple of the device count; padding rows
and absent micro-batches are zeros with mask/present False. Device side: `window_grads(...)`
accumulates over the micro-batches with lax.scan exactly as accumulate_gradients does (each
backpropagates value_j / n or sum_j / N, summed in micro-batch order, as torch's .grad +=), and
an absent micro-batch contributes nothing (lax.cond: it is not even computed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.data import Window
from ref_jax.accumulation import WindowOutput
from ref_jax.losses import LossOutput


class WindowLayout(NamedTuple):
    """The fixed shape of every window of a run: `steps` micro-batches of `rows` samples; inputs and
    targets cast to `x_dtype` / `y_dtype`, the scalars to `real_dtype`; `tokens`: a language model,
    whose loss sees (rows·T, vocab) logits against (rows·T,) targets."""

    steps: int
    rows: int
    x_dtype: Any
    y_dtype: Any
    real_dtype: Any  # of the scalars n and divisor: the parameters' dtype
    tokens: bool = False

    def pad(self, window: Window, counts: list[float], inject: bool = False) -> dict[str, np.ndarray]:
        """The window's arrays at the fixed shape (see the module docstring). `counts`: each
        micro-batch's valid-element count (conformance.run.window_counts), known before the
        forward pass; `inject`: [run] inject_nonfinite lists this update."""
        first = window.batches[0]
        x = np.zeros((self.steps, self.rows) + first.x.shape[1:], self.x_dtype)
        y = np.zeros((self.steps, self.rows) + first.y.shape[1:], self.y_dtype)
        mask = np.zeros((self.steps, self.rows), bool)
        present = np.zeros((self.steps,), bool)
        for j, b in enumerate(window.batches):
            k = len(b.index)
            x[j, :k], y[j, :k], mask[j, :k], present[j] = b.x, b.y, True, True
        total = float(np.sum(np.asarray(counts, np.float64)))  # as accumulate_gradients sums counts
        return {"x": x, "y": y, "mask": mask, "present": present,
                "n": np.asarray(len(window.batches), self.real_dtype), "divisor": np.asarray(total, self.real_dtype),
                "inject": np.asarray(bool(inject))}


def rows_for(batch_size: int, devices: int) -> int:
    """Micro-batch rows padded to a multiple of the device count (each device gets equal rows)."""
    return -(-batch_size // devices) * devices


def pad_rows(x: np.ndarray, y: np.ndarray, rows: int, x_dtype: Any, y_dtype: Any) -> dict[str, np.ndarray]:
    """One evaluation batch padded to `rows` samples, with its mask."""
    k = x.shape[0]
    xp = np.zeros((rows,) + x.shape[1:], x_dtype)
    yp = np.zeros((rows,) + y.shape[1:], y_dtype)
    xp[:k], yp[:k] = x, y
    mask = np.zeros((rows,), bool)
    mask[:k] = True
    return {"x": xp, "y": yp, "mask": mask}


def masked_loss(spec: LossSpec, out: LossOutput, rows: Any) -> LossOutput:
    """A loss whose mean never divides by 0: a micro-batch with nothing valid (all padding) has
    value 0, not NaN, so no NaN reaches a gradient through an untaken branch. batchmean divides
    by the real rows, not the padded ones."""
    count = rows.astype(out.sum.dtype) if spec.reduction == "batchmean" else out.count
    if spec.reduction == "sum":
        return LossOutput(out.sum, out.sum, count)
    safe = jnp.where(count > 0, count, jnp.ones_like(count))
    return LossOutput(out.sum / safe, out.sum, count)


def window_grads(spec: AccumulationSpec, loss_fn: Callable[[Any, Any], LossOutput], params: Any,
                 window: dict[str, Any], scale_loss: Callable[[Any], Any] | None) -> tuple[Any, WindowOutput]:
    """Gradients of one padded window, normalized once, as accumulate_gradients computes them.

    loss_fn(params, micro_batch) -> LossOutput, micro_batch = {"x", "y", "mask", "j"} (j: its
    index in the window). Returns (gradients like params, WindowOutput(loss, sum, divisor))."""
    tokens = spec.normalize == "tokens"
    divisor = window["divisor"] if tokens else window["n"]

    def part_fn(p: Any, mb: Any) -> tuple[Any, tuple[Any, Any]]:
        out = loss_fn(p, mb)
        d = divisor.astype(out.sum.dtype)
        part = out.sum / d if tokens else out.value / d
        return (scale_loss(part) if scale_loss is not None else part), (part, out.sum)

    grad_fn = jax.grad(part_fn, has_aux=True)
    batches = {"x": window["x"], "y": window["y"], "mask": window["mask"],
               "j": jnp.arange(window["present"].shape[0], dtype=jnp.int32)}
    first = jax.tree.map(lambda a: a[0], batches)
    _, (part_shape, sum_shape) = jax.eval_shape(part_fn, params, first)
    zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), part_shape.dtype), jnp.zeros((), sum_shape.dtype))

    def body(carry: Any, xs: Any) -> tuple[Any, None]:
        mb, present = xs

        def run(_: Any) -> Any:
            g, (part, s) = grad_fn(params, mb)
            return g, part, s

        g, part, s = jax.lax.cond(present, run, lambda _: zeros, None)
        acc, loss, total = carry
        return (jax.tree.map(jnp.add, acc, g), loss + part, total + s), None

    (grads, loss, total), _ = jax.lax.scan(body, zeros, (batches, window["present"]))
    return grads, WindowOutput(loss, total, divisor)
