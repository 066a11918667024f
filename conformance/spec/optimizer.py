"""`[optimizer]` and `[[optimizer.groups]]`: torch.optim vocabulary, torch defaults.

(First cut: the optimizers issue fills in every optimizer's fields and cross-field checks.)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from conformance.spec.base import NonNegative, Pair, Section, UnitHalfOpen

OptimizerName = Literal[
    "sgd", "adam", "adamw", "rmsprop", "adagrad", "adamax", "nadam", "radam", "lion", "adafactor", "muon"
]
OPTIMIZER_NAMES: tuple[str, ...] = OptimizerName.__args__  # type: ignore[attr-defined]


class GroupSpec(Section):
    """One parameter group: glob patterns over parameter names plus the fields it overrides."""

    params: list[str] = Field(min_length=1)
    lr: NonNegative | None = None
    weight_decay: NonNegative | None = None


class OptimizerSpec(Section):
    name: OptimizerName = "adamw"
    lr: NonNegative = 1e-3
    weight_decay: NonNegative = 1e-2
    betas: Pair(UnitHalfOpen) = (0.9, 0.999)
    eps: NonNegative = 1e-8
    momentum: NonNegative = 0.0
    groups: list[GroupSpec] = Field(default_factory=list)
