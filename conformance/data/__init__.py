"""The shared, framework-neutral data pipeline: NumPy batches that both trainers consume unchanged.

See pipeline.py for the loop (`DataPipeline.window(t)`), datasets.py for the data sets and
sampling.py for the index arithmetic; docs/models.md ("Data") for the semantics.
"""

from __future__ import annotations

from conformance.data.datasets import builtin_corpus, default_corpus, digits_raw, load_dataset
from conformance.data.pipeline import (
    Batch,
    DataPipeline,
    Window,
    batch_hash,
    planned_updates,
    updates_per_epoch,
)
from conformance.data.splits import ArraySplit, DataInfo, Dataset, TokenSplit, check_split

__all__ = [
    "ArraySplit", "Batch", "DataInfo", "DataPipeline", "Dataset", "TokenSplit", "Window", "batch_hash",
    "builtin_corpus", "check_split", "default_corpus", "digits_raw", "load_dataset",
    "planned_updates", "updates_per_epoch",
]
