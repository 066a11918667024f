"""`[model]`: the built-in models, with framework-neutral parameter names and initialization."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from conformance.spec.base import PosInt, Section, UnitHalfOpen

USED_BY: dict[str, tuple[str, ...]] = {
    "hidden": ("mlp",),
    "activation": ("mlp",),
    "norm": ("mlp",),
    "n_layer": ("gpt",),
    "n_head": ("gpt",),
    "n_embd": ("gpt",),
    "block_size": ("gpt",),
    "vocab_size": ("gpt",),
    "dropout": ("gpt",),
    "bias": ("gpt",),
}


class ModelSpec(Section):
    """(First cut: the trainer issue completes it.) `in_features`/`out_features` default to the data's."""

    name: Literal["linear", "mlp", "gpt"] = "mlp"
    in_features: PosInt | None = None
    out_features: PosInt | None = None
    hidden: list[PosInt] = Field(default_factory=lambda: [64])
    activation: Literal["gelu", "relu", "tanh"] = "gelu"
    norm: Literal["layernorm", "none"] = "layernorm"
    n_layer: PosInt = 2
    n_head: PosInt = 2
    n_embd: PosInt = 64
    block_size: PosInt = 64
    vocab_size: PosInt | None = None
    dropout: UnitHalfOpen = 0.0
    bias: bool = True

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        self.reject_unused(USED_BY, "name")
        return self
