"""`[checkpoint]`: when to save complete training state, how many to keep, how to resume.

    [checkpoint]
    every = 100          # save after every 100th update (0: only at the end of the run)
    keep_last = 2        # the newest 2 complete checkpoints are kept
    keep_best = true     # and, besides them, the one with the lowest validation loss

The format itself (directory per update, manifest, safetensors + JSON) is conformance.checkpoint's.
"""

from __future__ import annotations

from conformance.config.base import NonNegInt, PosInt, Section


class CheckpointSpec(Section):
    """`every = 0` saves only at the end; `at_end` saves after the last update. Retention runs after
    each new checkpoint is committed and never deletes the newest one. `allow_fallback`: on resume,
    if the newest checkpoint fails verification, use the previous complete one instead of stopping."""

    every: NonNegInt = 0
    at_end: bool = True
    keep_last: PosInt = 2
    keep_best: bool = False
    allow_fallback: bool = False
