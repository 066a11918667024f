"""The weights' EMA of a checkpoint, for export (the run's `[ema]`; docs/contract.md §5).

    weights = ema_weights("runs/x/checkpoints/step-00000100")    # {name: ndarray}, verified first
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from conformance.checkpoint.format import load_checkpoint
from conformance.errors import CheckpointError


def ema_weights(path: str | Path) -> dict[str, np.ndarray]:
    """The EMA weights saved in a checkpoint directory (verified before parsing, as every load), by
    neutral parameter name in their own dtype (float32, or float64 for float64 runs).
    CheckpointError when the checkpoint holds none (no [ema] decay, or saved before its start)."""
    checkpoint = load_checkpoint(path)
    if checkpoint.state.ema is None:
        raise CheckpointError(f"{Path(path)} holds no EMA weights (the run kept none: [ema] decay unset, or the "
                              f"checkpoint is from before ema.start)")
    return dict(checkpoint.state.ema)
