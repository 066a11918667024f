"""The framework-neutral checkpoint: one verified directory per saved update (see format.py).

- `format`: the directory layout, atomic save, verification before parsing, retention;
- `manifest`: the manifest's strict schema and its hash of itself;
- `latest`: which checkpoint a resume continues from (the newest that verifies, the fallback);
- `files`: durable writes and refusing reads, safetensors and strict JSON without pickle;
- `rng`: host generators (Python, NumPy) and every rank's generator states as tensors + JSON;
- `ema`: the weights' EMA of a checkpoint, for export (`ema_weights`).
"""

from __future__ import annotations

from conformance.checkpoint.format import (
    FILES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    STEP_RE,
    Checkpoint,
    TrainingState,
    apply_retention,
    check_tensors,
    library_versions,
    list_checkpoints,
    load_checkpoint,
    prepare_directory,
    save_checkpoint,
    step_name,
    verify_checkpoint,
)
from conformance.checkpoint.latest import find_latest, search

__all__ = [
    "FILES", "FORMAT", "FORMAT_VERSION", "MANIFEST", "STEP_RE", "Checkpoint", "TrainingState",
    "apply_retention", "check_tensors", "find_latest", "library_versions", "list_checkpoints",
    "load_checkpoint", "prepare_directory", "save_checkpoint", "search", "step_name", "verify_checkpoint",
]
