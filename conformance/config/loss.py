"""`[loss]`: which loss, with torch's constructor arguments and defaults."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, model_validator
from pydantic_core import PydanticCustomError

from conformance.config.base import FloatIn, NonNegative, Positive, Section, field_error

LossName = Literal[
    "mse", "l1", "cross_entropy", "nll", "bce_with_logits", "huber", "smooth_l1", "kl_div", "sigmoid_focal"
]
LOSS_NAMES: tuple[str, ...] = LossName.__args__  # type: ignore[attr-defined]

# Which loss reads which option; setting an option another loss would ignore is an error.
USED_BY: dict[str, tuple[str, ...]] = {
    "label_smoothing": ("cross_entropy",),
    "ignore_index": ("cross_entropy", "nll"),
    "weight": ("cross_entropy", "nll", "bce_with_logits", "sigmoid_focal"),
    "pos_weight": ("bce_with_logits",),
    "delta": ("huber",),
    "beta": ("smooth_l1",),
    "log_target": ("kl_div",),
    "alpha": ("sigmoid_focal",),
    "gamma": ("sigmoid_focal",),
    "z_loss": ("cross_entropy",),
}


def _nested_weights(value: Any) -> Any:
    """A number or a rectangular nested list of numbers >= 0 (torch's pos_weight tensor), as lists."""

    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, list):
            if depth > 8 or not v:
                raise PydanticCustomError("weights", "must be a number or a non-empty (nested) list of numbers")
            items = [walk(x, depth + 1) for x in v]
            shapes = {_shape(x) for x in items}
            if len(shapes) != 1:
                raise PydanticCustomError("weights", "must be a rectangular nested list (rows of equal length)")
            return items
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PydanticCustomError("weights", "must be a number or a (nested) list of numbers")
        if not math.isfinite(v) or v < 0:
            raise PydanticCustomError("weights", "must hold finite numbers >= 0 (found {v})", {"v": v})
        return float(v)

    return walk(value, 0)


def _shape(v: Any) -> tuple[int, ...]:
    return (len(v), *_shape(v[0])) if isinstance(v, list) else ()


# torch's pos_weight is a tensor broadcast against the prediction (shape rules: rules/inputs.py)
PosWeight = Annotated[Any, BeforeValidator(_nested_weights)]


def _focal_alpha(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("alpha", "must be a number")
    if not (0 <= value <= 1 or value == -1):
        raise PydanticCustomError(
            "alpha", "must be in [0, 1], or -1 for no alpha weighting (torchvision's convention)"
        )
    return float(value)


class LossSpec(Section):
    """A loss function. `weight` is torch's: per-class for cross_entropy/nll, per-element
    (broadcast over the last axis) for bce_with_logits and sigmoid_focal. `pos_weight` is a number
    or a (nested) list broadcast against the prediction as torch broadcasts it (`[2.5]` weighs every
    positive). sigmoid_focal is torchvision's `sigmoid_focal_loss`:
    ℓ = α_t·(1 − p_t)^γ·bce(x, y), p = σ(x), p_t = p·y + (1 − p)(1 − y),
    α_t = α·y + (1 − α)(1 − y) (α = -1: α_t = 1); defaults α = 0.25, γ = 2 (torchvision's).
    `z_loss` = c (cross_entropy only; 0 = off) is PaLM's auxiliary term: each element's loss gains
    c·c_i·(log Z_i)², log Z_i the logsumexp of its logits and c_i its count weight (1; 0 where
    ignored; w_{y_i} with class weights), so the mean is MaxText's / OLMo's z-loss mean
    (docs/contract.md §3, `z_loss`)."""

    name: LossName = "cross_entropy"
    reduction: Literal["mean", "sum", "none", "batchmean"] = "mean"
    label_smoothing: FloatIn(0.0, 1.0) = 0.0
    ignore_index: int = -100
    weight: list[NonNegative] | None = None
    pos_weight: PosWeight | None = None
    delta: Positive = 1.0
    beta: NonNegative = 1.0
    log_target: bool = False
    alpha: Annotated[float, BeforeValidator(_focal_alpha)] = 0.25
    gamma: NonNegative = 2.0
    z_loss: NonNegative = 0.0

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
