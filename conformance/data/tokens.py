"""`[data] name = "tokens"`: llm.c / modded-nanogpt token shards as a map-style data set.

    [data]
    name = "tokens"
    path = "shards/train_*.bin"      # glob of training shards (sorted by name)
    val_path = "shards/val_*.bin"    # glob of validation shards (optional)

Sample i is a window of block_size + 1 tokens: inputs its first block_size, targets the last
block_size (the inputs shifted by one). Training windows start every `stride` tokens (default
block_size) and never cross a shard boundary; validation windows do not overlap. Windows are
numbered shard after shard, so `take` is index arithmetic; each batch opens a fresh read-only
memory map of the shards it touches and drops it afterwards (nanoGPT's fix: a long-lived map keeps
every page it ever touched resident), so a shard of any size costs the pages of one batch.

Loading reads every shard once, in chunks and without mapping it: headers, sizes and every token
are checked (a token >= model.vocab_size is an error naming the file, the token index and the
byte offset) and hashed into the fingerprint of the checkpoint's data position (file names are
left out: moved shards still resume). The data position is the update count, as for every data set.
"""

from __future__ import annotations

import glob
import hashlib
import os
from functools import cached_property

import numpy as np

from conformance.config.data import DataSpec
from conformance.data.splits import DataInfo, Dataset
from conformance.data.shards import ShardHeader, open_tokens, read_header, scan
from conformance.errors import ConfigError, InputError


def shard_paths(pattern: str, field: str) -> list[str]:
    """The files a glob names, sorted (a plain file name is a glob of one); none is a ConfigError."""
    found = sorted(glob.glob(os.path.expanduser(pattern)))
    if not found:
        raise ConfigError(f"{field}: no file matches {pattern!r}")
    return found


class TokenShards:
    """Windows of block_size + 1 tokens over shards (see the module docstring); MapData."""

    def __init__(self, headers: list[ShardHeader], block_size: int, stride: int, fingerprint: str) -> None:
        self.headers, self.block_size, self.stride = headers, block_size, stride
        span = block_size + 1
        counts = [0 if h.count < span else (h.count - span) // stride + 1 for h in headers]
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self._fingerprint = fingerprint

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        index = np.asarray(index, np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= len(self)):
            raise IndexError(f"window index out of range 0..{len(self) - 1}")
        shard = np.searchsorted(self.offsets, index, side="right") - 1
        starts = (index - self.offsets[shard]) * self.stride
        out = np.empty((index.size, self.block_size + 1), np.int64)
        span = np.arange(self.block_size + 1)
        for s in np.unique(shard):
            rows = shard == s
            tokens = open_tokens(self.headers[s])  # a fresh map, dropped after this batch
            out[rows] = tokens[starts[rows][:, None] + span]
            del tokens
        # contiguous inputs and targets (views of one window would make every framework copy them)
        return {"x": np.ascontiguousarray(out[:, :-1]), "y": np.ascontiguousarray(out[:, 1:])}

    @cached_property
    def fingerprint(self) -> str:
        return self._fingerprint


def _read(pattern: str, field: str, vocab_size: int | None) -> tuple[list[ShardHeader], str, int]:
    digest = hashlib.sha256(b"tokens")
    headers, top = [], -1
    for path in shard_paths(pattern, field):
        header = read_header(path, field)
        digest.update(header.raw)
        top = max(top, scan(header, digest, vocab_size, field))
        headers.append(header)
    return headers, digest.hexdigest(), top


def load_tokens(spec: DataSpec, block_size: int, vocab_size: int | None = None) -> Dataset:
    """The training shards of data.path and the validation shards of data.val_path, checked."""
    train_h, train_fp, top = _read(spec.path or "", "data.path", vocab_size)  # DataSpec requires path
    stride = spec.stride or block_size
    train = TokenShards(train_h, block_size, stride, f"{train_fp}:{block_size}:{stride}")
    if len(train) == 0:
        longest = max(h.count for h in train_h)
        raise InputError(f"data.block_size: the shards of data.path hold at most {longest} tokens each, too few "
                         f"for one window of {block_size} + 1")
    if spec.val_path is not None:
        val_h, val_fp, val_top = _read(spec.val_path, "data.val_path", vocab_size)
        top = max(top, val_top)
        val = TokenShards(val_h, block_size, block_size, f"{val_fp}:{block_size}")
        if len(val) == 0:
            raise InputError(f"data.val_path: the shards hold fewer than block_size + 1 = {block_size + 1} tokens "
                             f"each: no validation window")
    else:
        val = TokenShards([], block_size, block_size, "none")
    fp = hashlib.sha256(f"{train.fingerprint}|{val.fingerprint}".encode("ascii")).hexdigest()
    out = vocab_size if vocab_size is not None else top + 1
    info = DataInfo("tokens", "language_model", None, out, None, None, block_size, len(train), len(val), fp)
    return Dataset(train, val, info)
