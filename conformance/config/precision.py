"""`[precision]`: compute dtype, master weights, dynamic loss scaling, non-finite policy.

    [precision]
    dtype = "float16"            # compute dtype: float64 | float32 | bfloat16 | float16
    allow_tf32 = false           # float32 matmuls in TF32 (torch allow_tf32 / JAX "tensorfloat32")
    loss_scale = "auto"          # "auto" (dynamic for float16, none otherwise) | "dynamic" | "none"
    init_scale = 65536.0         # torch.amp.GradScaler's arguments and defaults
    growth_factor = 2.0
    backoff_factor = 0.5
    growth_interval = 2000
    schedule_on_skip = "hold"    # a skipped update does not advance the schedule ("advance": it does)
    on_nonfinite = "skip"        # "skip" the update, or "raise" NonFiniteError naming the tensor
    max_consecutive_skips = 25   # this many skips in a row stop training (NonFiniteError)

Master weights and optimizer state stay in `param_dtype` (float32, or float64 for float64 runs);
the forward pass computes in `dtype` (torch.autocast; JAX casts by the Policy); model outputs are
`output_dtype` and losses are computed in float32 or wider.

Dynamic loss scaling is GradScaler's state machine, exactly: the scale is float32; per update the
loss is multiplied by the scale, gradients are multiplied by float32(1 / float64(scale)); a non-finite
update sets scale ← float32(scale · backoff_factor) and resets the growth tracker (no minimum);
otherwise the tracker counts up and at growth_interval the scale becomes float32(scale ·
growth_factor) if that is finite (else it stays) and the tracker resets.

An update is non-finite when the window loss or any unscaled gradient element is NaN or ±inf. It is
then skipped: parameters and optimizer state are left untouched, the skip is counted, and the
schedule holds (or advances with schedule_on_skip = "advance"; docs/contract.md §2).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from conformance.config.base import FloatIn, PosInt, Section, field_error

FLOAT32_MAX = 3.4028234663852886e38
Dtype = Literal["float64", "float32", "bfloat16", "float16"]
LOSS_SCALE_FIELDS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


class PrecisionSpec(Section):
    """Mixed precision and the non-finite policy (see the module docstring for the exact rules)."""

    dtype: Dtype = "float32"
    allow_tf32: bool = False
    loss_scale: Literal["auto", "dynamic", "none"] = "auto"
    init_scale: FloatIn(0.0, FLOAT32_MAX, lo_open=True) = 2.0**16
    growth_factor: FloatIn(1.0, FLOAT32_MAX, lo_open=True) = 2.0
    backoff_factor: FloatIn(0.0, 1.0, lo_open=True, hi_open=True) = 0.5
    growth_interval: PosInt = 2000
    schedule_on_skip: Literal["hold", "advance"] = "hold"
    on_nonfinite: Literal["skip", "raise"] = "skip"
    max_consecutive_skips: PosInt | None = 25

    @model_validator(mode="after")
    def _check(self) -> "PrecisionSpec":
        if not self.dynamic_scaling:
            for name in LOSS_SCALE_FIELDS:
                default = type(self).model_fields[name].default
                if name in self.model_fields_set and getattr(self, name) != default:
                    raise field_error(
                        name, f"is only used with dynamic loss scaling; received {getattr(self, name)!r} "
                              f"with loss_scale = {self.loss_scale!r} and dtype = {self.dtype!r}")
        if self.dynamic_scaling and self.on_nonfinite == "raise":
            raise field_error(
                "on_nonfinite", "= 'raise' would stop at the first overflow that dynamic loss scaling "
                                "is meant to absorb; use 'skip' (with max_consecutive_skips) or loss_scale = 'none'")
        return self

    @property
    def dynamic_scaling(self) -> bool:
        """True when gradients are scaled dynamically (loss_scale 'dynamic', or 'auto' with float16)."""
        return self.loss_scale == "dynamic" or (self.loss_scale == "auto" and self.dtype == "float16")

    @property
    def param_dtype(self) -> str:
        """Master weights and optimizer state: float64 for float64 runs, else float32."""
        return "float64" if self.dtype == "float64" else "float32"

    @property
    def compute_dtype(self) -> str:
        """The dtype the forward pass computes in."""
        return self.dtype

    @property
    def output_dtype(self) -> str:
        """Model outputs are cast back to the master dtype before the loss."""
        return self.param_dtype

    @property
    def autocast(self) -> bool:
        """True when the compute dtype is lower than the master dtype (torch.autocast is on)."""
        return self.dtype in ("bfloat16", "float16")

    def schedule_advances(self, skipped: bool) -> bool:
        """Whether the learning-rate schedule steps after an update that was (or was not) skipped."""
        return (not skipped) or self.schedule_on_skip == "advance"

    def schedule_position(self, update: int, skipped_before: int) -> int:
        """The schedule's t for update `update` when `skipped_before` earlier updates were skipped."""
        return update if self.schedule_on_skip == "advance" else update - skipped_before
