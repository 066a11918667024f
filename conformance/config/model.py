"""`[model]`: the built-in models, with framework-neutral parameter names and initialization.

    [model]
    name = "gpt"            # linear | mlp | gpt | user
    n_layer = 2
    n_head = 2
    n_embd = 64

Shapes the data already fixes (`in_features`, `out_features`, `vocab_size`) default to the data's;
set explicitly, they must agree with it. Parameter names, layouts and the initialization are
documented in docs/models.md and computed by `conformance.rules.models`. `user` is the model a
run was given in Python (`train(..., model=...)`, docs/your_model.md): a config that omits
`[model]` trains it, and may say `name = "user"` to set its few options.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from conformance.config.base import PosInt, Positive, Section, UnitHalfOpen, field_error

ModelName = Literal["linear", "mlp", "gpt", "user"]
MODEL_NAMES: tuple[str, ...] = ModelName.__args__  # type: ignore[attr-defined]

# Which model reads which option; setting an option another model would ignore is an error.
USED_BY: dict[str, tuple[str, ...]] = {
    "init": ("linear", "mlp", "gpt"),
    "in_features": ("linear", "mlp"),
    "out_features": ("linear", "mlp"),
    "hidden": ("mlp",),
    "activation": ("mlp",),
    "norm": ("mlp",),
    "n_layer": ("gpt",),
    "n_head": ("gpt",),
    "n_embd": ("gpt",),
    "block_size": ("gpt",),
    "vocab_size": ("gpt",),
    "dropout": ("gpt",),
    "init_std": ("gpt",),
    "flops_per_token": ("user",),
    "rename": ("user",),
    "fsdp_units": ("user",),
}


class ModelSpec(Section):
    """A built-in model. linear: y = x W^T + b. mlp: [Linear, activation, LayerNorm] per hidden width,
    then Linear (the seeds' 20→64 GELU LayerNorm →2 classifier by default). gpt: a nanoGPT-style
    decoder-only transformer (pre-LN, causal self-attention, GELU MLP, tied lm_head).
    `bias = false` drops every bias, LayerNorm's included (as nanoGPT's `bias`).
    user: the module passed to train(). `flops_per_token` (training FLOPs per token, e.g. 6·N + the
    attention term) turns on MFU for it; `rename` maps a framework's own parameter or state names
    to neutral ones (`{"fc.kernel" = "fc.weight"}`: a name that framework does not have is
    skipped, but each entry must name something on one side: the key or the value);
    `fsdp_units` are glob patterns over module names (torch `named_modules()`) that become FSDP2
    units (default: every top-level child module that holds parameters). `init` starts a fresh run of
    a built-in model from pretrained weights: a Hugging Face GPT-2 directory, a .safetensors, .pt or
    .bin state_dict, or a twinstep checkpoint or export (conformance/run/pretrained.py); a resume
    does not read it again."""

    name: ModelName = "mlp"
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
    init_std: Positive = 0.02
    flops_per_token: Positive | None = None
    rename: dict[str, str] = Field(default_factory=dict)
    fsdp_units: list[str] | None = None
    init: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        self.reject_unused(USED_BY, "name")
        if self.init is not None and not self.init.strip():
            raise field_error("init", "must name a weights file or directory; omit it to start from the seed's "
                                      "initialisation")
        if self.name == "mlp" and not self.hidden:
            raise field_error("hidden", "must list at least one width; use name = 'linear' for no hidden layer")
        if len(set(self.rename.values())) != len(self.rename):
            raise field_error("rename", "maps two names to the same neutral name")
        if self.name == "gpt" and self.n_embd % self.n_head:
            raise field_error(
                "n_embd", f"must be divisible by n_head = {self.n_head}; received {self.n_embd}"
            )
        return self
