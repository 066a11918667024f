"""`[checkpoint]`: when to save complete training state, and how many to keep."""

from __future__ import annotations

from conformance.spec.base import NonNegInt, PosInt, Section


class CheckpointSpec(Section):
    """(First cut: the trainer issue completes it.) `every = 0` saves only at the end."""

    every: NonNegInt = 0
    keep_last: PosInt = 2
    keep_best: bool = False
