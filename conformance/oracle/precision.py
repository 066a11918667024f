"""Dynamic loss scaling and the non-finite policy in NumPy, from GradScaler's rules.

Loss-scale state (scale: float32, growth_tracker: int), per update with `finite` the update's flag:

    not finite:  scale ← float32(float64(scale) · backoff_factor),  tracker ← 0
    finite:      tracker + 1 == growth_interval ?
                     scale ← float32(float64(scale) · growth_factor) if that is finite, tracker ← 0
                 :   tracker ← tracker + 1

(torch._amp_update_scale_, which GradScaler.update calls; no minimum scale.) Gradients are
unscaled by float32(1 / float64(scale)).

The non-finite policy and its messages are conformance.rules.nonfinite (shared with the twins).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.config.precision import PrecisionSpec
from conformance.rules.loss_scale import require_dynamic_scaling
from conformance.rules.nonfinite import check_nonfinite


def update_scale(spec: PrecisionSpec, scale: np.float32, tracker: int, finite: bool) -> tuple[np.float32, int]:
    """One GradScaler.update: the new (scale, growth_tracker)."""
    if not finite:
        return np.float32(np.float64(scale) * spec.backoff_factor), 0
    successful = tracker + 1
    if successful == spec.growth_interval:
        with np.errstate(over="ignore"):  # growth past float32's range is the capped case
            grown = np.float32(np.float64(scale) * spec.growth_factor)
        return (grown if np.isfinite(grown) else np.float32(scale)), 0
    return np.float32(scale), successful


def inverse_scale(scale: np.float32) -> np.float32:
    """GradScaler's unscale factor: the reciprocal in float64, rounded to float32."""
    return np.float32(1.0 / np.float64(scale))


def loss_scale_trace(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict[str, Any]:
    """Run the loss-scale state machine over per-update finite flags.

    Returns {"scale": scale in force at each update, "skipped": per update, "growth_tracker":
    after each update}; raises NonFiniteError per the non-finite policy."""
    require_dynamic_scaling(spec)
    scale, tracker, consecutive = np.float32(spec.init_scale), 0, 0
    scales: list[float] = []
    skipped: list[bool] = []
    trackers: list[int] = []
    for t, ok in enumerate(finite):
        ok = bool(ok)
        scales.append(float(scale))
        skipped.append(not ok)
        consecutive = 0 if ok else consecutive + 1
        check_nonfinite(spec, consecutive, True, {}, update=t, finite=ok)
        scale, tracker = update_scale(spec, scale, tracker, ok)
        trackers.append(tracker)
    return {"scale": scales, "skipped": skipped, "growth_tracker": trackers}
