"""One optimizer update, the whole path, for the torch trainer (issue 6) and tests/test_update_path.py.

    scale → backward over the window (accumulation) → unscale + finite check → clip → optimizer.step()
    or skip → scaler update → scheduler.step() or hold

A skipped update leaves parameters and optimizer state untouched (optimizer.step() is not called),
is counted in SkipState, and advances the scheduler only with schedule_on_skip = "advance".
The non-finite policy raises before anything is applied, so the last good state stays intact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from conformance.spec.accumulation import AccumulationSpec
from conformance.spec.clip import ClipSpec
from conformance.spec.precision import PrecisionSpec
from ref_torch.accumulation import accumulate_gradients
from ref_torch.clipping import clip_gradients, total_norm
from ref_torch.precision import LossScaler, SkipState, check_nonfinite, finite_flags, record_update


class UpdateSpecs(NamedTuple):
    accumulation: AccumulationSpec
    clip: ClipSpec
    precision: PrecisionSpec


class UpdateInfo(NamedTuple):
    """What the metrics line of one update needs (CONTRACT.md §5)."""

    loss: float
    grad_norm: float
    skipped: bool
    loss_scale: float | None
    schedule_advanced: bool


def apply_update(
    specs: UpdateSpecs,
    params: Mapping[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: LossScaler,
    skips: SkipState,
    loss_fn: Callable[[Any, Any], Any],
    window: Any,
    counts: Any = None,
    update: int | None = None,
    reduce_count: Callable[[Any], Any] | None = None,
    no_sync: Callable[[], Any] | None = None,
) -> tuple[SkipState, UpdateInfo]:
    """Run one update in place (parameters, optimizer, scheduler, scaler); return the new counters
    and the update's metrics. Raises NonFiniteError per specs.precision before applying anything."""
    loss_scale = scaler.get_scale()
    grads, out = accumulate_gradients(specs.accumulation, loss_fn, params, window, counts,
                                      scale_loss=scaler.scale, reduce_count=reduce_count, no_sync=no_sync)
    grads, grads_ok = scaler.unscale(grads)  # unscale before clipping (seed 000's order)
    loss_ok = bool(torch.isfinite(out.loss))
    finite = bool(grads_ok) and loss_ok
    if finite:
        _, norm = clip_gradients(specs.clip, grads)
    else:
        norm = total_norm(grads, specs.clip.norm_type)  # logged; clipping NaN grads would be moot
    skips = record_update(skips, finite)
    if not finite:
        loss_flag, grad_flags = finite_flags(out.loss, grads)
        check_nonfinite(specs.precision, skips, loss_flag, grad_flags, update)
    else:
        optimizer.step()
    scaler.update(torch.tensor(finite))
    advanced = specs.precision.schedule_advances(not finite)
    if scheduler is not None and advanced:
        scheduler.step()
    value = float(out.loss)
    return skips, UpdateInfo(value, float(norm), not finite, loss_scale, advanced)
