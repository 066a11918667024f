"""Accumulation windows laid out on the host at one fixed shape, so the accumulation loop
(ref_jax.accumulation.accumulate_gradients) compiles once for every window of a run.

`stack_window(batches, counts, steps, real_dtype, rows)` turns the micro-batches of one window
(mappings of NumPy arrays, nested mappings allowed) into

    every entry stacked on a leading axis of `steps`   (absent micro-batches: zeros)
    present [steps]   the real micro-batches          n        their number
    divisor           Σ counts (normalize = "tokens", summed in float64 as torch sums them; absent
                      when the counts are not known before the forward pass: a user's loss_fn)

and, given `rows`, pads every entry of rank ≥ 1 with zeros to `rows` samples and adds
mask [steps, rows] marking the real ones. `WindowLayout.pad(window)` is that layout for a
conformance.data.Window: each micro-batch is {"data": every entry of the batch (x, y, or a user's
fields), "inject": the [run] inject_nonfinite flag}, floating entries in the run's dtype, integer
ones as int32, with `rows` the micro-batch size rounded up to a multiple of the device count.
`masked_loss` keeps a padded micro-batch's mean from dividing by padding.
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
    micro-batch; None when normalize = "micro_batches" or when a loss_fn returns them) give the
    divisor, absent without them."""
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
    out.update(present=present, n=np.asarray(len(batches), real_dtype))
    if counts is not None:  # float64 on the host, rounded once: the torch loop sums the counts the same way
        out["divisor"] = np.asarray(float(np.sum(np.asarray(counts, np.float64))), real_dtype)
    if mask is not None:
        out["mask"] = mask
    return out


def _rows(batch: Mapping[str, Any]) -> int:
    return next(np.shape(a)[0] for a in jax.tree.leaves(dict(batch)) if np.ndim(a))


def cast_fields(fields: Mapping[str, Any], real_dtype: Any) -> dict[str, np.ndarray]:
    """A batch's entries at the run's dtypes: floating ones in `real_dtype`, integer ones int32
    (class labels and token ids; JAX's default integer), booleans as they are."""
    out = {}
    for key, value in fields.items():
        a = np.asarray(value)
        if np.issubdtype(a.dtype, np.floating):
            a = a.astype(real_dtype, copy=False)
        elif np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int32, copy=False)
        out[key] = a
    return out


def batch_fields(batch: Any) -> Mapping[str, Any]:
    """Every entry of a conformance.data.Batch (x and y when it carries no fields)."""
    return batch.fields if batch.fields is not None else {"x": batch.x, "y": batch.y}


class WindowLayout(NamedTuple):
    """The fixed shape of every window of a run: `steps` micro-batches of `rows` samples; floating
    entries cast to `real_dtype` (the parameters' dtype, also of the scalars n and divisor);
    `tokens`: a language model, whose loss sees (rows·T, vocab) logits against (rows·T,) targets."""

    steps: int
    rows: int
    real_dtype: Any
    tokens: bool = False

    def pad(self, window: Window, counts: list[float] | None, inject: bool = False) -> dict[str, Any]:
        """The window's arrays at the fixed shape: data (every entry), mask, inject (per
        micro-batch), present, n, divisor. `counts`: each micro-batch's valid-element count
        (conformance.run.batches.window_counts), known before the forward pass (None with a
        loss_fn: no divisor); `inject`: [run] inject_nonfinite lists this update."""
        flag = np.asarray(bool(inject))
        batches = [{"data": cast_fields(batch_fields(b), self.real_dtype), "inject": flag} for b in window.batches]
        return stack_window(batches, counts, self.steps, self.real_dtype, self.rows)


def rows_for(batch_size: int, devices: int) -> int:
    """Micro-batch rows padded to a multiple of the device count (each device gets equal rows)."""
    return -(-batch_size // devices) * devices


def pad_rows(fields: Mapping[str, Any], rows: int, real_dtype: Any) -> dict[str, Any]:
    """One evaluation batch padded to `rows` samples: {"data": entries, "mask": real rows}."""
    cast = cast_fields(fields, real_dtype)
    data = {}
    for key, a in cast.items():
        padded = np.zeros((rows,) + a.shape[1:], a.dtype)
        padded[:a.shape[0]] = a
        data[key] = padded
    k = next(iter(cast.values())).shape[0]
    mask = np.zeros((rows,), bool)
    mask[:k] = True
    return {"data": data, "mask": mask}


def masked_loss(spec: LossSpec, out: LossOutput, rows: Any) -> LossOutput:
    """A loss whose mean never divides by 0: a micro-batch with nothing valid (all padding) has
    value 0, not NaN, so no NaN reaches a gradient through an untaken branch. batchmean divides
    by the real rows, not the padded ones."""
    count = rows.astype(out.sum.dtype) if spec.reduction == "batchmean" else out.count
    if spec.reduction == "sum":
        return LossOutput(out.sum, out.sum, count)
    safe = jnp.where(count > 0, count, jnp.ones_like(count))
    return LossOutput(out.sum / safe, out.sum, count)
