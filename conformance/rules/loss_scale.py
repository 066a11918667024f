"""Dynamic loss scaling: what a spec must say before a loss-scale state machine may run.

The state machine itself (GradScaler's rules: back off on a non-finite update, grow after
growth_interval finite ones) is written out in conformance.oracle.precision and, in their own
frameworks, in ref_torch.precision and ref_jax.precision.
"""

from __future__ import annotations

from conformance.config.precision import PrecisionSpec
from conformance.errors import InputError


def require_dynamic_scaling(spec: PrecisionSpec) -> None:
    """InputError unless `spec` asks for a dynamic loss scale (a loss-scale trace needs one)."""
    if not spec.dynamic_scaling:
        raise InputError(f"precision: loss_scale = {spec.loss_scale!r} with dtype = {spec.dtype!r} "
                         "has no dynamic loss scale; set loss_scale = 'dynamic'")
