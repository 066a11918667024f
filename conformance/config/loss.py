"""`[loss]`: which loss, with torch's constructor arguments and defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from conformance.config.base import FloatIn, NonNegative, Positive, Section, field_error

LossName = Literal[
    "mse", "l1", "cross_entropy", "nll", "bce_with_logits", "huber", "smooth_l1", "kl_div"
]
LOSS_NAMES: tuple[str, ...] = LossName.__args__  # type: ignore[attr-defined]

# Which loss reads which option; setting an option another loss would ignore is an error.
USED_BY: dict[str, tuple[str, ...]] = {
    "label_smoothing": ("cross_entropy",),
    "ignore_index": ("cross_entropy", "nll"),
    "weight": ("cross_entropy", "nll", "bce_with_logits"),
    "pos_weight": ("bce_with_logits",),
    "delta": ("huber",),
    "beta": ("smooth_l1",),
    "log_target": ("kl_div",),
}


class LossSpec(Section):
    """A loss function. `weight` is torch's: per-class for cross_entropy/nll, per-element
    (broadcast over the last axis) for bce_with_logits."""

    name: LossName = "cross_entropy"
    reduction: Literal["mean", "sum", "none", "batchmean"] = "mean"
    label_smoothing: FloatIn(0.0, 1.0) = 0.0
    ignore_index: int = -100
    weight: list[NonNegative] | None = None
    pos_weight: list[NonNegative] | None = None
    delta: Positive = 1.0
    beta: NonNegative = 1.0
    log_target: bool = False

    @model_validator(mode="after")
    def _check(self) -> "LossSpec":
        self.reject_unused(USED_BY, "name")
        if self.reduction == "batchmean" and self.name != "kl_div":
            raise field_error(
                "reduction", f"'batchmean' is only defined for kl_div; received name = {self.name!r}"
            )
        if self.weight is not None and len(self.weight) == 0:
            raise field_error("weight", "must not be empty; omit it for no weighting")
        if self.weight is not None and self.name in ("cross_entropy", "nll") and sum(self.weight) == 0:
            raise field_error("weight", "class weights must not all be 0")
        return self
