"""Accumulation windows laid out on the host at one fixed shape, so the accumulation loop
(ref_jax.accumulation.accumulate_gradients) compiles once for every window of a run.

`stack_window(batches, counts, steps, real_dtype, rows)` turns the micro-batches of one window
(mappings of NumPy arrays, nested mappings allowed) into

    every entry stacked on a leading axis of `steps`   (absent micro-batches: zeros)
    present [steps]   the real micro-batches          n        their number
    divisor           Σ counts (normalize = "tokens", summed in float64 as torch sums them)

and, given `rows`, pads every entry of rank ≥ 1 with zeros to `rows` samples and adds
mask [steps, rows] marking the real ones. `WindowLayout.pad(window)` is that layout for a
conformance.data.Window (x, y and the [run] inject_nonfinite flag, at the run's dtypes), with
`rows` the micro-batch size rounded up to a multiple of the device count. `masked_loss` keeps a
padded micro-batch's mean from dividing by padding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from conformance.config.loss import LossSpec
from conformance.data import Window
from conformance.errors import InputError
from ref_jax.losses import LossOutput

WINDOW_ENTRIES = ("present", "n", "divisor")  # the window's own entries; every other one is per micro-batch


def stack_window(batches: Sequence[Mapping[str, Any]], counts: Sequence[float] | None, steps: int,
                 real_dtype: Any, rows: int | None = None) -> dict[str, Any]:
    """One window at the fixed shape accumulate_gradients takes (see the module docstring).

    Every micro-batch has the entries and trailing shapes of the first one; `counts` (one per
    micro-batch, may be None when normalize = "micro_batches") give the divisor, NaN without them."""
    if not batches or len(batches) > steps:
        raise InputError(f"a window holds 1 to {steps} micro-batches; received {len(batches)}")
    reserved = set(WINDOW_ENTRIES) | ({"mask"} if rows is not None else set())
    if reserved & set(batches[0]):
        raise InputError(f"micro-batch entries {sorted(reserved & set(batches[0]))} are the window's own")

    def empty(leaf: Any) -> np.ndarray:
        a = np.asarray(leaf)
        shape = a.shape if rows is None or a.ndim == 0 else (rows,) + a.shape[1:]
        return np.zeros((steps,) + shape, a.dtype)

    out: dict[str, Any] = jax.tree.map(empty, dict(batches[0]))
    mask = np.zeros((steps, rows), bool) if rows is not None else None
    slots = jax.tree.leaves(out)
    for j, batch in enumerate(batches):
        for slot, leaf in zip(slots, jax.tree.leaves(dict(batch)), strict=True):
            a = np.asarray(leaf)
            if rows is not None and a.ndim:
                slot[j, :a.shape[0]] = a
            else:
                slot[j] = a
        if mask is not None:
            mask[j, :_rows(batch)] = True
    present = np.zeros((steps,), bool)
    present[:len(batches)] = True
    # float64 on the host, rounded once: the torch loop sums the counts the same way
    total = np.nan if counts is None else float(np.sum(np.asarray(counts, np.float64)))
    out.update(present=present, n=np.asarray(len(batches), real_dtype), divisor=np.asarray(total, real_dtype))
    if mask is not None:
        out["mask"] = mask
    return out


def _rows(batch: Mapping[str, Any]) -> int:
    return next(np.shape(a)[0] for a in jax.tree.leaves(dict(batch)) if np.ndim(a))


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
        """The window's arrays at the fixed shape: x, y, mask, inject (per micro-batch), present, n,
        divisor. `counts`: each micro-batch's valid-element count (conformance.run.batches.window_counts),
        known before the forward pass; `inject`: [run] inject_nonfinite lists this update."""
        flag = np.asarray(bool(inject))
        batches = [{"x": np.asarray(b.x, self.x_dtype), "y": np.asarray(b.y, self.y_dtype), "inject": flag}
                   for b in window.batches]
        return stack_window(batches, counts, self.steps, self.real_dtype, self.rows)


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
