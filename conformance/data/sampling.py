"""Pure index arithmetic of the data pipeline: shuffles, micro-batches, accumulation windows, ranks.

Everything here is a function of integers (seed, epoch, sizes, rank), never of hidden state, so
the data position of a run is just the update count and a resumed run replays the same batches.

    order  = epoch_order(seed, epoch, n, shuffle)        # which sample comes when in this epoch
    bounds = micro_batch_bounds(n, global_batch, drop_last)
    micro  = window_micro_batches(window_in_epoch, steps, len(bounds))
    part   = shard(order[start:stop], rank, world_size)  # this rank's slice of a global micro-batch
"""

from __future__ import annotations

import hashlib

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


def epoch_order(seed: int, epoch: int, n: int, shuffle: bool = True) -> np.ndarray:
    """The order in which the n training samples are visited in `epoch` (identity without shuffle)."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return random_order(seed, "shuffle", n, epoch)


def micro_batch_bounds(n: int, global_batch: int, drop_last: bool) -> list[tuple[int, int]]:
    """(start, stop) of each global micro-batch in an epoch's order; the last one is short unless
    dropped by `drop_last`."""
    full, rest = divmod(n, global_batch)
    bounds = [(i * global_batch, (i + 1) * global_batch) for i in range(full)]
    if rest and not drop_last:
        bounds.append((full * global_batch, n))
    return bounds


def window_micro_batches(window: int, steps: int, n_micro: int) -> range:
    """Indices (within the epoch) of the micro-batches that make accumulation window `window`."""
    return range(window * steps, min((window + 1) * steps, n_micro))


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank `rank`'s contiguous part of a global micro-batch: np.array_split into world_size parts.

    Full micro-batches split into equal parts of the per-rank batch size; a short last one into
    parts that differ by at most one sample (a part may be empty when fewer samples than ranks)."""
    return np.array_split(indices, world_size)[rank]


def window_sizes(bounds: list[tuple[int, int]], steps: int, n_windows: int) -> list[int]:
    """Global number of samples in each accumulation window of an epoch."""
    sizes = []
    for w in range(n_windows):
        micro = window_micro_batches(w, steps, len(bounds))
        sizes.append(sum(bounds[j][1] - bounds[j][0] for j in micro))
    return sizes


def fingerprint(*arrays: np.ndarray, label: str = "") -> str:
    """sha256 over arrays' dtypes, shapes and bytes: identifies a dataset (or a batch) exactly."""
    digest = hashlib.sha256(label.encode("utf-8"))
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"|{a.dtype.str}{a.shape}|".encode("ascii"))
        digest.update(a.tobytes())
    return digest.hexdigest()
