"""`[data]`: the shared NumPy data pipeline (same batches for both backends)."""

from __future__ import annotations

from typing import Literal

from conformance.spec.base import FloatIn, PosInt, Section


class DataSpec(Section):
    """(First cut: the trainer issue completes it.) `batch_size` is the micro-batch per rank."""

    name: Literal["linear_regression", "binary_blobs", "digits", "text"] = "binary_blobs"
    batch_size: PosInt = 64
    n_samples: PosInt | None = None
    val_fraction: FloatIn(0.0, 1.0, hi_open=True) = 0.2
    shuffle: bool = True
    drop_last: bool = False
    path: str | None = None
