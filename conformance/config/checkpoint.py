"""`[checkpoint]`: when to save complete training state, how many to keep, how to resume.

    [checkpoint]
    every = 500          # save after every 500th update (the default; 0: only at the end of the run)
    keep_last = 2        # the newest 2 complete checkpoints are kept
    keep_best = true     # and, besides them, the one with the lowest validation loss

The format itself (directory per update, manifest, safetensors + JSON) is conformance.checkpoint's.
"""

from __future__ import annotations

from conformance.config.base import NonNegInt, PosInt, Section


class CheckpointSpec(Section):
    """`every` updates between saves, 500 by default so that a hard kill (SIGKILL, the OOM killer, a
    lost node) loses at most 500 updates (HF Trainer's `save_steps` and torchtitan's
    `checkpoint.interval` default to 500 as well; SIGTERM / SIGINT save wherever they land); `every
    = 0` saves only at the end; `at_end` saves after the last update. Retention runs after each new
    checkpoint is committed and never deletes the newest one. `allow_fallback`: on resume, if the
    newest checkpoint fails verification, use the previous complete one instead of stopping."""

    every: NonNegInt = 500
    at_end: bool = True
    keep_last: PosInt = 2
    keep_best: bool = False
    allow_fallback: bool = False
