"""Tensors as NumPy arrays in their own dtype, for checkpoints and exports (ref_torch.backend.to_numpy
gives float64 for comparisons instead)."""

from __future__ import annotations

import numpy as np
import torch


def native_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array in its own dtype (a copy on the host; bfloat16 as ml_dtypes')."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: move the bits, then view them as ml_dtypes'
        import ml_dtypes  # here: importing it costs a process ~0.7 s to start

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()
