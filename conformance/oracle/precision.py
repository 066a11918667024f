"""Dynamic loss scaling and the non-finite policy in NumPy, from GradScaler's rules.

Loss-scale state (scale: float32, growth_tracker: int), per update with `finite` the update's flag:

    not finite:  scale ← float32(float64(scale) · backoff_factor),  tracker ← 0
    finite:      tracker + 1 == growth_interval ?
                     scale ← float32(float64(scale) · growth_factor) if that is finite, tracker ← 0
                 :   tracker ← tracker + 1

(torch._amp_update_scale_, which GradScaler.update calls; no minimum scale.) Gradients are
unscaled by float32(1 / float64(scale)).

The host-side policy helpers here (`check_nonfinite`, the messages) are shared by ref_torch and
ref_jax, so both raise the same NonFiniteError with the same one-line message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from conformance.errors import InputError, NonFiniteError
from conformance.spec.precision import PrecisionSpec


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


def describe_nonfinite(loss_finite: bool, grads_finite: Mapping[str, bool]) -> str:
    """'the loss' or "the gradient of 'w'": the first non-finite tensor, loss first."""
    if not loss_finite:
        return "the loss"
    bad = [name for name, ok in grads_finite.items() if not ok]
    if not bad:
        return "the gradients"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"the gradient of {bad[0]!r}{more}"


def check_nonfinite(
    spec: PrecisionSpec,
    consecutive: int,
    loss_finite: bool,
    grads_finite: Mapping[str, bool],
    update: int | None = None,
    finite: bool | None = None,
) -> None:
    """Apply the non-finite policy after an update was (or was not) skipped; raises NonFiniteError.

    `consecutive` counts the skipped updates in a row, this one included. on_nonfinite = "raise"
    raises at the first non-finite update; "skip" raises once more than max_consecutive_skips
    updates in a row were skipped. The update is never applied in either case. `finite` overrides
    the flags' conjunction when only the overall decision is known."""
    if finite is None:
        finite = bool(loss_finite) and all(bool(v) for v in grads_finite.values())
    if finite:
        return
    at = "" if update is None else f" at update {update}"
    what = describe_nonfinite(bool(loss_finite), {k: bool(v) for k, v in grads_finite.items()})
    if spec.on_nonfinite == "raise":
        raise NonFiniteError(
            f"{what} is non-finite{at} (precision.on_nonfinite = 'raise'); the update was not applied")
    limit = spec.max_consecutive_skips
    if limit is not None and consecutive > limit:
        raise NonFiniteError(
            f"{consecutive} consecutive updates were skipped for non-finite values, more than "
            f"precision.max_consecutive_skips = {limit}; last: {what}{at}")


def loss_scale_trace(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict[str, Any]:
    """Run the loss-scale state machine over per-update finite flags.

    Returns {"scale": scale in force at each update, "skipped": per update, "growth_tracker":
    after each update}; raises NonFiniteError per the non-finite policy."""
    if not spec.dynamic_scaling:
        raise InputError(f"precision: loss_scale = {spec.loss_scale!r} with dtype = {spec.dtype!r} "
                         "has no dynamic loss scale; set loss_scale = 'dynamic'")
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
