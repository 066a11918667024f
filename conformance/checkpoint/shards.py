"""Sharded checkpoints (format 3): every rank's slices in its own file, read back whole or slice by slice.

    step-00000012/
        rank-00000.safetensors      rank 0's box of every sharded tensor ("model/w", "optimizer/w/m", ...)
        rank-00001.safetensors      rank 1's
        replicated.safetensors      tensors no rank shards (0-d optimizer steps, ...), written by rank 0
        rng.safetensors, state.json, config.toml, manifest.json     as in the whole layout

The manifest's `tensors` table gives every tensor's global shape, dtype and pieces (file, start,
stop); conformance.checkpoint.manifest checks it completely, and `check_tiling` that the pieces of
each tensor cover its shape exactly once, before any tensor file is opened. A loaded sharded
checkpoint holds `ShardedTensor`s: `.shape` and `.dtype` from the manifest, `.read(index)` the
slice `index` (reading, verifying against the manifest's sha256 and parsing only the files that
overlap it, each once), `np.asarray(t)` the whole tensor. So a rank of a resumed run reads only the
files holding its slices, whatever the world size that wrote them; `conformance.checkpoint.load_checkpoint`
assembles whole tensors for everyone else (export, one process, the JAX trainer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conformance.checkpoint import files as io
from conformance.errors import CheckpointCorruptError

Piece = tuple[str, Sequence[int], Sequence[int]]  # (file, start, stop)


def check_tiling(key: str, shape: Sequence[int], pieces: Sequence[Piece], where: Path) -> None:
    """The pieces' boxes lie inside `shape`, do not overlap and cover it exactly (CheckpointCorruptError
    naming the manifest, the tensor and the file of the first bad piece otherwise)."""
    volume = 0
    for file, start, stop in pieces:
        if any(not 0 <= a <= b <= n for a, b, n in zip(start, stop, shape)):
            raise CheckpointCorruptError(f"{where}: tensors.{key}: the piece in {file} [{list(start)}, {list(stop)}) "
                                         f"lies outside the shape {list(shape)}")
        volume += math.prod(b - a for a, b in zip(start, stop))
    for i, (fa, sa, ea) in enumerate(pieces):
        for fb, sb, eb in pieces[i + 1:]:
            if all(max(a0, b0) < min(a1, b1) for a0, a1, b0, b1 in zip(sa, ea, sb, eb)):
                raise CheckpointCorruptError(f"{where}: tensors.{key}: the pieces in {fa} and {fb} overlap; slices "
                                             f"must tile the shape {list(shape)}")
    if volume != math.prod(shape):
        raise CheckpointCorruptError(f"{where}: tensors.{key}: the pieces cover {volume} of the "
                                     f"{math.prod(shape)} elements of shape {list(shape)}; slices must tile it")


def dim0_slice(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s rows [start, stop) of a dimension of size n split over `world` ranks as
    torch.chunk and FSDP2's Shard(0) split it: ceil(n / world) rows each, the last ranks shorter or empty."""
    size = -(-n // world) if n else 0
    start = min(rank * size, n)
    return start, min(start + size, n)


class ShardSet:
    """The tensor files of one sharded checkpoint, opened on demand: each file read once, checked
    against the manifest's size and sha256 and against the table (exactly its pieces, of the listed
    shapes and dtypes), then kept until `release()`."""

    def __init__(self, path: Path, manifest: dict[str, Any], opened: Callable[[Path], Any]) -> None:
        self.path, self._opened = path, opened  # opened(path): the directory's descriptor, no link followed
        self.table: dict[str, dict[str, Any]] = manifest["tensors"]
        self.entries: dict[str, dict[str, Any]] = manifest["files"]
        self._files: dict[str, dict[str, np.ndarray]] = {}

    def file(self, name: str) -> dict[str, np.ndarray]:
        if name not in self._files:
            entry = self.entries[name]
            with self._opened(self.path) as fd:
                data = io.read_verified(self.path, name, entry["size"], entry["sha256"], dir_fd=fd)
            self._files[name] = self._checked(name, io.decode_tensors(data, self.path / name))
        return self._files[name]

    def _checked(self, name: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        where = self.path / name
        listed = {key: (start, stop) for key, e in self.table.items()
                  for p in e["pieces"] if p["file"] == name for start, stop in [(p["start"], p["stop"])]}
        for key in sorted(set(tensors) | set(listed)):
            if key not in listed:
                raise CheckpointCorruptError(f"{where}: tensor {key!r} is not a piece the manifest lists for this file")
            if key not in tensors:
                raise CheckpointCorruptError(f"{where} lacks tensor {key!r}, which the manifest lists in it")
            start, stop = listed[key]
            want = tuple(b - a for a, b in zip(start, stop))
            got = tensors[key]
            if tuple(got.shape) != want or got.dtype.name != self.table[key]["dtype"]:
                raise CheckpointCorruptError(f"{where}: tensor {key!r} is {got.dtype.name} {tuple(got.shape)}; the "
                                             f"manifest says {self.table[key]['dtype']} {want}")
        return tensors

    def preload(self, data: dict[str, bytes]) -> None:
        """Files already read and verified (a whole load reads every file while verifying)."""
        for name, raw in data.items():
            self._files[name] = self._checked(name, io.decode_tensors(raw, self.path / name))

    def tensor(self, key: str) -> ShardedTensor:
        return ShardedTensor(self, key)

    def release(self) -> None:
        """Forget the files read so far (their memory)."""
        self._files.clear()


class ShardedTensor:
    """One tensor of a sharded checkpoint, read lazily (see the module docstring). `lazy` tells
    checks that its values have not been read (conformance.rules.state checks finiteness on read)."""

    lazy = True

    def __init__(self, shards: ShardSet, key: str) -> None:
        self.shards, self.key = shards, key
        entry = shards.table[key]
        self.shape = tuple(int(n) for n in entry["shape"])
        self.dtype = io.numpy_dtype(io.CODES[entry["dtype"]])
        self.pieces = [(p["file"], tuple(p["start"]), tuple(p["stop"])) for p in entry["pieces"]]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def files_for(self, index: Sequence[slice] | None = None) -> list[str]:
        """The files holding some of `index` (every element: None)."""
        box = self._box(index)
        return [f for f, s, e in self.pieces if _overlap(box, s, e) is not None]

    def _box(self, index: Sequence[slice] | None) -> tuple[tuple[int, int], ...]:
        index = tuple(index or ()) + (slice(None),) * (self.ndim - len(tuple(index or ())))
        out = []
        for sl, n in zip(index, self.shape):
            a, b, step = sl.indices(n)
            if step != 1:
                raise ValueError("ShardedTensor.read takes contiguous slices")
            out.append((a, max(a, b)))
        return tuple(out)

    def read(self, index: Sequence[slice] | None = None) -> np.ndarray:
        """The box `index` (a slice per leading dimension; None: the whole tensor), reading only the
        files that overlap it. Weights, optimizer state and EMA must be finite (CheckpointCorruptError
        otherwise)."""
        box = self._box(index)
        out = np.empty(tuple(b - a for a, b in box), self.dtype)
        for file, start, stop in self.pieces:
            common = _overlap(box, start, stop)
            if common is None:
                continue
            src = self.shards.file(file)[self.key]
            out[tuple(slice(a - o[0], b - o[0]) for (a, b), o in zip(common, box))] = \
                src[tuple(slice(a - s, b - s) for (a, b), s in zip(common, start))]
        if out.dtype.kind == "f" and not np.all(np.isfinite(out)):
            raise CheckpointCorruptError(f"{self.shards.path}: {self.key} contains a non-finite value")
        return out

    def __getitem__(self, index: Any) -> np.ndarray:
        """t[a:b] or t[a:b, c:d]: read() of those contiguous slices."""
        return self.read(index if isinstance(index, tuple) else (index,))

    def astype(self, dtype: Any) -> np.ndarray:
        return self.read().astype(dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.read()
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"ShardedTensor({self.key!r}, shape={self.shape}, dtype={self.dtype.name}, pieces={len(self.pieces)})"


def _overlap(box: Sequence[tuple[int, int]], start: Sequence[int], stop: Sequence[int]) -> tuple | None:
    common = tuple((max(a, s), min(b, e)) for (a, b), s, e in zip(box, start, stop))
    return None if any(a >= b for a, b in common) else common


def split_tensors(shards: ShardSet) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any] | None]:
    """(model, optimizer, ema) of a sharded checkpoint as ShardedTensors by neutral name."""
    model: dict[str, Any] = {}
    optimizer: dict[str, dict[str, Any]] = {}
    ema: dict[str, Any] = {}
    for key in shards.table:
        kind, _, rest = key.partition("/")
        if kind == "model":
            model[rest] = shards.tensor(key)
        elif kind == "ema":
            ema[rest] = shards.tensor(key)
        else:
            param, name = rest.rsplit("/", 1)
            optimizer.setdefault(param, {})[name] = shards.tensor(key)
    return model, optimizer, ema or None


def is_lazy(value: Any) -> bool:
    return bool(getattr(value, "lazy", False))
