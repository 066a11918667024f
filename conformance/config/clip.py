"""`[clip]`: gradient clipping by global norm, per parameter or by value (torch.nn.utils semantics).

    [clip]
    max_norm = 1.0          # clip the global norm; the pre-clip norm is returned and logged
    norm_type = 2.0         # any p > 0, or inf (TOML `inf` or "inf")
    eps = 1e-6              # torch's denominator term; eps = 0 is optax.clip_by_global_norm exactly
    per_parameter = false   # true: every parameter's gradient is clipped to max_norm on its own
    error_if_nonfinite = false
    target = "gradients"    # or "updates": clip the optimizer's step instead (optax's clip after adam)

or `clip_value = 0.5` (clamp every element to [-0.5, 0.5]). No field set: no clipping, but the
gradient norm is still computed and logged.

Semantics, with n the norm of order p over all gradients (per-tensor norms, then the norm of
those, as torch's get_total_norm), c = max_norm:

- eps > 0 (torch): g ← g · min(c / (n + eps), 1), always multiplied (clip_grad_norm_).
- eps = 0 (optax): g unchanged when n < c, else g ← (g / n) · c (clip_by_global_norm's `>=` rule),
  evaluated as (g · (1 / n)) · c because XLA rewrites optax's division by the scalar n into that
  multiplication; the same operations make every backend bit-for-bit optax's.
- per_parameter: the same rule with each parameter's own norm n_i (torch: one clip_grad_norm_ call
  per parameter); the returned norm is still the global one.
- clip_value = v: g ← clamp(g, -v, v) (clip_grad_value_, optax.clip).
- clip_value and max_norm together: by value first, then by norm on the clamped gradients (torch's
  clip_grad_value_ then clip_grad_norm_; optax.chain(optax.clip(v), clip_by_global_norm(c))). The
  returned and logged norm is still the one before any clipping.

target = "updates" applies the same rules to the optimizer's step instead of the gradients: with
p the parameters before the update and p' after the optimizer's whole step (its lr, momentum,
weight decay and cautious mask included), Δ = p' − p is clipped and p ← p + clip(Δ); the
optimizer's state is not touched. It is optax.chain(optax.adamw(...), optax.clip_by_global_norm(c))
(or optax.clip(v) after the optimizer), whose clip sees the updates scaled by −lr. The gradients
are then not clipped; the logged norm is still the gradients' norm. error_if_nonfinite is a
gradient rule and is refused with it.

Clipping runs on unscaled gradients. In a training update a non-finite gradient is [precision]'s
business (skip or raise); error_if_nonfinite then only fires when every gradient is finite but the
norm overflows, or when clip_gradients is called on its own.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from conformance.config.base import NonNegative, Positive, Section, field_error

TORCH_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s hard-coded denominator term


def _inf_word(value: Any) -> Any:
    # torch accepts norm_type='inf'; TOML also has a bare `inf` float.
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    return value


def _positive_or_inf(value: float) -> float:
    if math.isnan(value) or value <= 0:
        raise PydanticCustomError("range", "must be > 0 (or inf)")
    return value


NormType = Annotated[
    float, Field(allow_inf_nan=True), BeforeValidator(_inf_word), AfterValidator(_positive_or_inf)
]


class ClipSpec(Section):
    """Gradient clipping. No field set = no clipping (the norm is still computed for logging)."""

    max_norm: Positive | None = None
    norm_type: NormType = 2.0
    clip_value: Positive | None = None
    per_parameter: bool = False
    eps: NonNegative = TORCH_EPS
    error_if_nonfinite: bool = False
    target: Literal["gradients", "updates"] = "gradients"

    @model_validator(mode="after")
    def _check(self) -> "ClipSpec":
        if self.target == "updates":
            if self.mode == "none":
                raise field_error("target", "'updates' needs a rule to apply: set max_norm or clip_value")
            if self.error_if_nonfinite:
                raise field_error("error_if_nonfinite", "is a gradient rule; with target = 'updates' a "
                                                        "non-finite gradient skips the update ([precision])")
        if self.max_norm is None:
            for name in ("per_parameter", "eps"):
                if name in self.model_fields_set and getattr(self, name) != type(self).model_fields[name].default:
                    raise field_error(name, f"is only used with max_norm; received {getattr(self, name)!r} "
                                            "without max_norm")
        return self

    @property
    def mode(self) -> str:
        """'global_norm', 'per_parameter', 'value' or 'none': the norm rule when max_norm is set (with
        clip_value as well, clamping comes first), else clipping by value alone."""
        if self.max_norm is None:
            return "none" if self.clip_value is None else "value"
        return "per_parameter" if self.per_parameter else "global_norm"

    def targets(self) -> tuple["ClipSpec", "ClipSpec | None"]:
        """(the rule on the gradients, the rule on the optimizer's step or None): with target =
        "updates" the gradients are not clipped (a rule without clipping, of the same norm_type, whose
        norm is still logged)."""
        if self.target == "gradients":
            return self, None
        return ClipSpec.model_construct(norm_type=self.norm_type), self
