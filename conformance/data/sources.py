"""The map-style protocol every data set implements, built-in or brought by a user.

    class MyData:
        def __len__(self) -> int: ...                                # samples
        def take(self, index: np.ndarray) -> dict[str, np.ndarray]:  # a batch: those samples, in that order
            ...
        fingerprint: str                                             # changes when the samples change

The pipeline draws every batch through these three (conformance.data.pipeline): seeded shuffles,
micro-batches, ranks and accumulation windows are index arithmetic over `len`, a batch is
`take(indices)`, and the fingerprint goes into the checkpoint's data position, so a resume refuses
data that changed. The built-in splits (conformance.data.datasets) implement the same protocol.

`ArrayData(arrays)` is the protocol over a mapping of NumPy arrays (np.memmap too) with a common
first axis: take indexes every array; the fingerprint is sha256 over every array, read in chunks
(a memory-mapped array is never read whole into memory). `Subset(source, indices)` is a part of a
source (a train/validation split) without copying it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import numpy as np

from conformance.errors import InputError

CHUNK_BYTES = 16 << 20  # rows hashed or scanned at a time: bounded memory for memory-mapped arrays


@runtime_checkable
class MapData(Protocol):
    """Samples addressed by index: `len(data)`, `data.take(indices) -> {name: array}` (first axis =
    the indices, in order) and `data.fingerprint` (a string that changes when the samples do)."""

    def __len__(self) -> int: ...

    def take(self, index: np.ndarray) -> Mapping[str, np.ndarray]: ...

    @property
    def fingerprint(self) -> str: ...


def row_chunks(a: np.ndarray) -> range:
    """Start rows of chunks of about CHUNK_BYTES each."""
    row = max(1, int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize)
    return range(0, a.shape[0], max(1, CHUNK_BYTES // row))


def hash_array(digest: Any, a: np.ndarray) -> None:
    """Feed dtype, shape and bytes of `a` to a hashlib digest, chunk by chunk (as sampling.fingerprint
    does for small arrays: the same digest for the same array)."""
    digest.update(f"|{a.dtype.str}{a.shape}|".encode("ascii"))
    if a.ndim == 0:
        digest.update(np.ascontiguousarray(a).tobytes())
        return
    step = row_chunks(a).step
    for start in range(0, a.shape[0], step):
        digest.update(np.ascontiguousarray(a[start:start + step]).tobytes())


class ArrayData:
    """MapData over {name: array} with a common first axis (see the module docstring)."""

    def __init__(self, arrays: Mapping[str, Any], where: str = "data") -> None:
        if not isinstance(arrays, Mapping) or not arrays:
            raise InputError(f"{where} must be a non-empty mapping of NumPy arrays, e.g. {{'x': x, 'y': y}}")
        out: dict[str, np.ndarray] = {}
        for key, value in arrays.items():
            if not isinstance(key, str):
                raise InputError(f"{where}: keys must be strings; received {key!r}")
            if not isinstance(value, np.ndarray):
                raise InputError(f"{where}[{key!r}] must be a NumPy array (or np.memmap); received "
                                 f"{type(value).__name__}")
            if value.ndim == 0:
                raise InputError(f"{where}[{key!r}] is a scalar; every entry needs a first axis of samples")
            out[key] = value
        sizes = {k: int(v.shape[0]) for k, v in out.items()}
        if len(set(sizes.values())) > 1:
            raise InputError(f"{where}: entries must share their first axis (samples); received lengths {sizes}")
        self.arrays = out
        self.where = where

    def __len__(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0])

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {k: np.asarray(v[index]) for k, v in self.arrays.items()}

    @cached_property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(b"arrays")
        for key in sorted(self.arrays):
            digest.update(key.encode("utf-8"))
            hash_array(digest, self.arrays[key])
        return digest.hexdigest()


class Subset:
    """Samples `indices` of `source` (a split), itself MapData; nothing is copied."""

    def __init__(self, source: MapData, indices: np.ndarray) -> None:
        self.source, self.indices = source, np.asarray(indices, np.int64)

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def take(self, index: np.ndarray) -> Mapping[str, np.ndarray]:
        return self.source.take(self.indices[np.asarray(index, np.int64)])

    @cached_property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(str(self.source.fingerprint).encode("utf-8"))
        digest.update(self.indices.tobytes())
        return digest.hexdigest()


def as_source(data: Any, where: str = "data") -> MapData:
    """`data` as MapData: a mapping of arrays becomes ArrayData; an object with __len__, take and
    fingerprint is used as it is. Anything else is an InputError naming what is missing."""
    if isinstance(data, Mapping):
        return ArrayData(data, where)
    missing = [name for name in ("__len__", "take", "fingerprint") if not hasattr(data, name)]
    if missing:
        raise InputError(f"{where} must be a mapping of NumPy arrays with a common first axis, or an object "
                         f"with __len__, take(indices) and fingerprint; {type(data).__name__} has no "
                         f"{', '.join(missing)}")
    return data
