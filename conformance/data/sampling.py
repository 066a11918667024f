"""Pure index arithmetic of the data pipeline: shuffles, micro-batches, accumulation windows, ranks.

Everything here is a function of integers (seed, epoch, sizes, rank), never of hidden state, so
the data position of a run is just the update count and a resumed run replays the same batches.
Nothing is proportional to the data set's size but an epoch's order of up to LARGE samples:
micro-batch bounds and window sizes are arithmetic, and a larger data set (a big token shard has
millions of windows) is shuffled by a keyed permutation computed per index (`Permutation`).

    order  = epoch_order(seed, epoch, n, shuffle)        # which sample comes when in this epoch
    bounds = micro_batch_bounds(n, global_batch, drop_last)
    micro  = window_micro_batches(window_in_epoch, steps, len(bounds))
    part   = shard(order[start:stop], rank, world_size)  # this rank's slice of a global micro-batch
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np


def stream(seed: int, purpose: str, *more: int) -> np.random.Generator:
    """A NumPy generator for one purpose ("shuffle", "split", "binary_blobs", ...): PCG64 seeded
    from SeedSequence([seed, purpose as an integer, *more]), independent of every other stream."""
    return np.random.Generator(np.random.PCG64(_seed_sequence(seed, purpose, *more)))


def _seed_sequence(seed: int, purpose: str, *more: int) -> np.random.SeedSequence:
    tag = int.from_bytes(purpose.encode("utf-8"), "big")
    return np.random.SeedSequence([int(seed), tag, *(int(m) for m in more)])


def random_order(seed: int, purpose: str, n: int, *more: int) -> np.ndarray:
    """A permutation of range(n): the stable argsort of n raw 64-bit PCG64 outputs.

    Defined by the bit generator's raw stream alone (stable across NumPy versions), not by
    Generator.permutation's algorithm."""
    bits = np.random.PCG64(_seed_sequence(seed, purpose, *more)).random_raw(n)
    return np.argsort(np.asarray(bits, np.uint64), kind="stable").astype(np.int64)


LARGE = 1 << 21  # beyond this many samples the argsort's arrays (8 bytes a sample, three times) make way


class Permutation:
    """A pseudo-random permutation of range(n) computed per index, for data sets of more than LARGE
    samples: a 4-round Feistel network over the smallest even number of bits covering n, keyed by
    four 64-bit words of PCG64(SeedSequence([seed, "shuffle", epoch])) and walked in cycles until the
    value falls below n. `order[i]`, `order[a:b]` and np.asarray(order) give int64 indices; memory
    does not grow with n."""

    ROUNDS = 4

    def __init__(self, seed: int, epoch: int, n: int) -> None:
        self.n = n
        bits = max(2, int(n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = np.random.PCG64(_seed_sequence(seed, "shuffle", epoch)).random_raw(self.ROUNDS).astype(np.uint64)

    def __len__(self) -> int:
        return self.n

    def _round(self, x: np.ndarray, key: np.uint64) -> np.ndarray:
        # splitmix64's finalizer over (x + key): a well-mixed function of the half-block
        z = x + key
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & self.mask

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half)
        left, right = x >> shift, x & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << shift) | right

    def _apply(self, idx: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            y = self._encrypt(idx.astype(np.uint64))
            out = y >= np.uint64(self.n)
            while out.any():  # cycle walking: a bijection of [0, 2^bits) restricted to [0, n)
                y[out] = self._encrypt(y[out])
                out = y >= np.uint64(self.n)
        return y.astype(np.int64)

    def __getitem__(self, key: int | slice) -> np.ndarray:
        if isinstance(key, slice):
            return self._apply(np.arange(*key.indices(self.n), dtype=np.int64))
        return self._apply(np.asarray([key], np.int64))[0]

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)


def epoch_order(seed: int, epoch: int, n: int, shuffle: bool = True) -> np.ndarray | Permutation:
    """The order in which the n training samples are visited in `epoch` (identity without shuffle):
    the stable argsort of n raw PCG64 outputs (random_order), or beyond LARGE samples a Permutation
    computed per index."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    if n > LARGE:
        return Permutation(seed, epoch, n)
    return random_order(seed, "shuffle", n, epoch)


class Bounds:
    """(start, stop) of each global micro-batch of an epoch, as arithmetic (len, [j]): full ones of
    `global_batch` samples, the last one short unless dropped (drop_last)."""

    def __init__(self, n: int, global_batch: int, drop_last: bool) -> None:
        self.n, self.size = n, global_batch
        full, rest = divmod(n, global_batch)
        self.count = full + (1 if rest and not drop_last else 0)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, j: int) -> tuple[int, int]:
        if not 0 <= j < self.count:
            raise IndexError(f"micro-batch {j} of {self.count}")
        return j * self.size, min((j + 1) * self.size, self.n)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return (self[j] for j in range(self.count))

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, Bounds)) else NotImplemented


def micro_batch_bounds(n: int, global_batch: int, drop_last: bool) -> Bounds:
    """(start, stop) of each global micro-batch in an epoch's order; the last one is short unless
    dropped by `drop_last`."""
    return Bounds(n, global_batch, drop_last)


def window_micro_batches(window: int, steps: int, n_micro: int) -> range:
    """Indices (within the epoch) of the micro-batches that make accumulation window `window`."""
    return range(window * steps, min((window + 1) * steps, n_micro))


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank `rank`'s contiguous part of a global micro-batch: np.array_split into world_size parts.

    Full micro-batches split into equal parts of the per-rank batch size; a short last one into
    parts that differ by at most one sample (a part may be empty when fewer samples than ranks)."""
    if world_size == 1:
        return indices  # array_split's one part, without its cost
    return np.array_split(indices, world_size)[rank]


class WindowSizes:
    """Global samples in each accumulation window of an epoch, as arithmetic: `sizes[w]` and
    `sizes.first(k)` (samples in windows 0 .. k-1); micro-batches are contiguous in the epoch."""

    def __init__(self, bounds: Bounds, steps: int, n_windows: int) -> None:
        self.bounds, self.steps, self.n_windows = bounds, steps, n_windows
        self._total = self.first(n_windows)

    def __len__(self) -> int:
        return self.n_windows

    def first(self, k: int) -> int:
        # micro-batches 0 .. min(k * steps, count) - 1 end where the last one stops: its start plus a
        # full micro-batch, or the epoch's end (n) for a short last one
        b = self.bounds
        return min(min(k * self.steps, b.count) * b.size, b.n) if k > 0 else 0

    def __getitem__(self, w: int) -> int:
        if not 0 <= w < self.n_windows:
            raise IndexError(f"window {w} of {self.n_windows}")
        b = self.bounds  # first(w + 1) - first(w), in one go (once per update)
        lo = w * self.steps
        return min(min(lo + self.steps, b.count) * b.size, b.n) - min(min(lo, b.count) * b.size, b.n)

    def total(self) -> int:
        return self._total


def window_sizes(bounds: Bounds, steps: int, n_windows: int) -> WindowSizes:
    """Global number of samples in each accumulation window of an epoch."""
    return WindowSizes(bounds, steps, n_windows)


def fingerprint(*arrays: np.ndarray, label: str = "") -> str:
    """sha256 over arrays' dtypes, shapes and bytes: identifies a dataset (or a batch) exactly."""
    digest = hashlib.sha256(label.encode("utf-8"))
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"|{a.dtype.str}{a.shape}|".encode("ascii"))
        digest.update(a.tobytes())
    return digest.hexdigest()
