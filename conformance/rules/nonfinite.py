"""Non-finite values: how every backend finds them, what it does about them and what it says.

- `describe_nonfinite`: which tensor to name (the loss first, then the first gradient in parameter
  order; conformance.rules.inputs.first_nonfinite finds it among host arrays);
- `nonfinite_norm_message`: clip.error_if_nonfinite's one-line error;
- `check_nonfinite`: the [precision] on_nonfinite policy after an update was (or was not) skipped:
  NonFiniteError at the first non-finite update under "raise", or beyond max_consecutive_skips
  (`policy_raises` says beforehand whether it will).

ref_torch, ref_jax and the oracle all call these, so they raise the same NonFiniteError with the
same message.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from conformance.config.clip import ClipSpec
from conformance.config.precision import PrecisionSpec
from conformance.errors import NonFiniteError


def nonfinite_norm_message(spec: ClipSpec, norm: float, bad: str | None) -> str:
    """The one-line error of `error_if_nonfinite`, shared by every backend."""
    order = "inf" if math.isinf(spec.norm_type) else f"{spec.norm_type:g}"
    if bad is not None:
        return (f"clip.error_if_nonfinite: the gradient of {bad!r} is non-finite (total norm of "
                f"order {order} is {norm})")
    return (f"clip.error_if_nonfinite: the total gradient norm of order {order} overflowed to {norm} "
            f"although every gradient is finite")


def describe_nonfinite(loss_finite: bool, grads_finite: Mapping[str, bool]) -> str:
    """'the loss' or "the gradient of 'w'": the first non-finite tensor, loss first."""
    if not loss_finite:
        return "the loss"
    bad = [name for name, ok in grads_finite.items() if not ok]
    if not bad:
        return "the gradients"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return f"the gradient of {bad[0]!r}{more}"


def policy_raises(spec: PrecisionSpec, consecutive: int) -> bool:
    """Whether check_nonfinite raises for a skipped update, `consecutive` skipped in a row (this one
    included): a trainer reads its flags, to name the bad tensor, only then."""
    limit = spec.max_consecutive_skips
    return spec.on_nonfinite == "raise" or (limit is not None and consecutive > limit)


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
    if finite or not policy_raises(spec, consecutive):
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
