"""Data a user brings: `train(config, out, data=...)` and `[data] name = "arrays"` become a Dataset.

`data` is a mapping of NumPy arrays (or np.memmap) with a common first axis, `{"x": ..., "y": ...}`
by default (`[data] inputs` / `targets` name the entries), any conformance.data.sources.MapData
object (len, take, fingerprint), or a pair (train, validation) of either. A single data set is split
as the built-in ones are: `data.val_fraction` of it (default 0: no validation) by a seeded random
split (data.seed, else run.seed), each part in the original order; nothing is copied.

The DataInfo comes from a probe batch (the first two samples): floating targets are a regression,
integer targets with one axis classes, integer targets with a sequence axis a language model
(tokens_per_s and MFU count its positions). Arrays are also checked once, on the host and in chunks:
finite floating inputs and regression targets, labels >= 0 (their maximum + 1 is the class count).
An object with its own `take` is not scanned: its batches are what it says.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from conformance.config.data import DataSpec
from conformance.data.splits import (
    DataInfo,
    Dataset,
    Task,
    n_validation,
    random_split,
)
from conformance.data.sources import ArrayData, MapData, Subset, as_source, row_chunks
from conformance.errors import InputError

# The batch entry a loss_fn reads to tell real samples from padding rows (the JAX trainer pads a
# short micro-batch to one shape; torch's is all True): data may not have an entry of that name.
SAMPLE_MASK = "sample_mask"


def _sources(spec: DataSpec, data: Any, seed: int, where: str) -> tuple[MapData, MapData]:
    if isinstance(data, tuple):
        if len(data) != 2:
            raise InputError(f"{where} as a tuple must be (train, validation); received {len(data)} items")
        if spec.val_fraction:
            raise InputError(f"data.val_fraction = {spec.val_fraction}: {where} already is (train, validation); "
                             f"set val_fraction to 0")
        return as_source(data[0], f"{where}[0]"), as_source(data[1], f"{where}[1]")
    full = as_source(data, where)
    n_val = n_validation(len(full), spec.val_fraction or 0.0)
    if n_val >= len(full):
        raise InputError(f"data.val_fraction = {spec.val_fraction} leaves no training samples out of {len(full)}")
    if n_val == 0:
        return full, Subset(full, np.zeros(0, np.int64))
    train, val = random_split(len(full), n_val, seed)
    return Subset(full, train), Subset(full, val)


def _task(y: np.ndarray | None) -> Task:
    if y is None or np.issubdtype(y.dtype, np.floating):
        return "regression"
    return "classification" if y.ndim == 1 else "language_model"


def _first_nonfinite(part: np.ndarray, rows: np.ndarray, named: str) -> None:
    """Refuse a chunk holding a NaN or an inf, naming it by its row in the user's array (`rows`: the
    chunk's rows there) and, for a table, its column."""
    bad = ~np.isfinite(part.astype(np.float64))
    if bad.any():
        at = np.argwhere(bad)[0]
        place = f"row {int(rows[at[0]])}" + (f", column {int(at[1])}" if part.ndim == 2 else
                                             f", position {tuple(int(i) for i in at[1:])}" if part.ndim > 2 else "")
        raise InputError(f"{named} holds a non-finite value ({part[tuple(at)]}) at {place}")


def _scan(source: MapData, spec: DataSpec, task: Task, where: str, origin: Any = None) -> int | None:
    """Finite inputs and regression targets, labels >= 0, chunk by chunk; the largest label + 1.
    `origin(key)` names an entry where the user keeps it (a file), else `where[key]`."""
    base = source.source if isinstance(source, Subset) else source
    if not isinstance(base, ArrayData):
        return None
    index = source.indices if isinstance(source, Subset) else None
    n, top = len(source), -1
    for key in (spec.inputs, spec.targets):
        a = base.arrays.get(key)
        if a is None:
            continue
        step = row_chunks(a).step
        for start in range(0, n, step):
            rows = slice(start, min(start + step, n))
            part = np.asarray(a[rows] if index is None else a[index[rows]])
            if np.issubdtype(part.dtype, np.floating) and (key == spec.inputs or task == "regression"):
                at = np.arange(rows.start, rows.stop) if index is None else index[rows]
                _first_nonfinite(part, at, origin(key) if origin is not None else f"{where}[{key!r}]")
            if key == spec.targets and task != "regression" and part.size:
                low = part.reshape(part.shape[0], -1).min(axis=1)
                if int(low.min()) < 0:
                    raise InputError(f"{where}[{key!r}]: label {int(low.min())} at sample "
                                     f"{start + int(np.argmax(low < 0))} is negative")
                top = max(top, int(part.max()))
    return top + 1 if top >= 0 else None


def user_dataset(spec: DataSpec, data: Any, seed: int, needs_targets: bool = True, name: str = "user",
                 where: str = "data", origins: tuple[Any, Any] | None = None) -> Dataset:
    """The Dataset of `data` (see the module docstring). `needs_targets`: `[loss]` compares the model's
    output with data[targets] (a loss_fn reads whatever it likes). `origins`: for the training and
    the validation part, `origin(key)` naming the file an entry comes from (errors name its rows)."""
    train, val = _sources(spec, data, seed, where)
    if len(train) == 0:
        raise InputError(f"{where} has no training samples")
    probe = train.take(np.arange(min(2, len(train))))
    if not hasattr(probe, "keys"):
        raise InputError(f"{where}.take(indices) must return a mapping of arrays; received {type(probe).__name__}")
    if SAMPLE_MASK in probe:
        raise InputError(f"{where}: the entry {SAMPLE_MASK!r} is reserved (the trainers add it for loss_fn); "
                         f"rename it")
    required = [spec.inputs] + ([spec.targets] if needs_targets else [])
    for field, key in zip(("inputs", "targets"), required):
        if key not in probe:
            raise InputError(f"data.{field} = {key!r}, but the data's entries are {sorted(probe)}")
    x = np.asarray(probe[spec.inputs])
    y = np.asarray(probe[spec.targets]) if spec.targets in probe else None
    task = _task(y)
    classes = None
    for part, label, origin in ((train, f"{where} train", origins and origins[0]),
                                (val, f"{where} validation", origins and origins[1])):
        found = _scan(part, spec, task, label, origin) if len(part) else None
        classes = found if classes is None or (found is not None and found > classes) else classes
    in_features = int(x.shape[1]) if x.ndim == 2 and np.issubdtype(x.dtype, np.floating) else None
    if task == "regression":
        out = int(y.shape[1]) if y is not None and y.ndim == 2 else None
    else:
        out = classes
    block = int(y.shape[1]) if task == "language_model" and y is not None else None
    digest = hashlib.sha256(f"{name}|{spec.inputs}|{spec.targets}".encode("utf-8"))
    for part in (train, val):
        digest.update(str(part.fingerprint).encode("utf-8"))
    info = DataInfo(name, task, in_features, out, classes if task == "classification" else None, None, block,
                    len(train), len(val), digest.hexdigest())
    return Dataset(train, val, info)
