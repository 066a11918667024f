"""`[clip]`: gradient clipping by global norm or by value (torch.nn.utils semantics)."""

from __future__ import annotations

from conformance.spec.base import Positive, Section


class ClipSpec(Section):
    """No field set = no clipping. (First cut: the precision/clipping issue completes it.)"""

    max_norm: Positive | None = None
    norm_type: Positive = 2.0
    clip_value: Positive | None = None
