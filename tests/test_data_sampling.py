"""Sampling arithmetic (conformance/data/sampling.py): the keyed permutation that shuffles data sets of
more than LARGE samples without an array per sample, and the micro-batch bounds and window sizes
computed per index instead of listed. Each check has a negative control it catches."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.config import load_config
from conformance.data import DataPipeline, sampling
from conformance.data.sampling import (
    LARGE,
    Bounds,
    Permutation,
    epoch_order,
    window_micro_batches,
)
from tests.test_data import lin, resumed_batches_match


def is_bijection(order: object, n: int) -> bool:
    """The check: `order` lists every index of range(n) exactly once."""
    got = np.asarray(order)
    return got.shape == (n,) and np.array_equal(np.sort(got), np.arange(n))


def is_deterministic(make: object) -> bool:
    """The check: two permutations made from the same (seed, epoch, n) are the same order."""
    return np.array_equal(np.asarray(make(3, 1, 1000)), np.asarray(make(3, 1, 1000)))


class NotABijection(Permutation):
    """Negative control: a 'Feistel' round that drops the left half (no longer invertible)."""

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half)
        left, right = x >> shift, x & self.mask
        for key in self.keys:
            left, right = right, self._round(right, key)
        return (left << shift) | right


class Unkeyed(Permutation):
    """Negative control: keys drawn from the OS instead of (seed, epoch)."""

    def __init__(self, seed: int, epoch: int, n: int) -> None:
        super().__init__(seed, epoch, n)
        self.keys = np.frombuffer(os.urandom(8 * self.ROUNDS), np.uint64).copy()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 4097, 65536 + 17])
def test_permutation_is_a_deterministic_bijection(n: int) -> None:
    perm = Permutation(11, 4, n)
    full = np.asarray(perm)
    assert full.dtype == np.int64 and is_bijection(full, n)
    assert np.array_equal(full, np.asarray(Permutation(11, 4, n)))
    # per-index and per-slice access agree with the whole order
    for i in {0, n // 3, n - 1}:
        assert perm[i] == full[i]
    assert np.array_equal(perm[n // 4: n // 2 + 1], full[n // 4: n // 2 + 1])
    if n >= 64:  # a shuffle, and a different one per epoch and per seed
        assert not np.array_equal(full, np.arange(n))
        assert not np.array_equal(full, np.asarray(Permutation(11, 5, n)))
        assert not np.array_equal(full, np.asarray(Permutation(12, 4, n)))


def test_permutation_negative_controls() -> None:
    assert is_deterministic(Permutation)
    assert not is_bijection(NotABijection(11, 4, 1000), 1000)
    assert not is_deterministic(Unkeyed)


def test_epoch_order_up_to_large_is_the_argsort_order() -> None:
    # The order of every data set of up to LARGE samples is unchanged (checkpoints resume the same):
    # the stable argsort of raw PCG64 outputs; beyond LARGE a Permutation, never materialized here.
    ss = np.random.SeedSequence([5, int.from_bytes(b"shuffle", "big"), 1])
    at_large = epoch_order(5, 1, LARGE)
    assert isinstance(at_large, np.ndarray)
    assert np.array_equal(at_large, np.argsort(np.random.PCG64(ss).random_raw(LARGE), kind="stable"))
    beyond = epoch_order(5, 1, LARGE + 1)
    assert isinstance(beyond, Permutation) and len(beyond) == LARGE + 1
    part = beyond[LARGE - 100:]
    assert part.shape == (101,) and len(set(part.tolist())) == 101 and part.max() <= LARGE


def test_a_pipeline_over_a_permutation_visits_each_sample_once_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    config = lin(n=37, batch=4, steps=3, epochs=3)
    def epoch0(p: DataPipeline) -> np.ndarray:
        return np.concatenate([b.index for t in range(p.updates_per_epoch) for b in p.window(t).batches])

    argsorted = epoch0(DataPipeline(load_config(config)))
    monkeypatch.setattr(sampling, "LARGE", 8)  # 37 samples are "large" now: shuffled by a Permutation
    p = DataPipeline(load_config(config))
    seen = epoch0(p)
    assert is_bijection(seen, 37) and not np.array_equal(seen, argsorted)
    assert resumed_batches_match(DataPipeline, config, resume_at=5, horizon=3 * p.updates_per_epoch)


def listed_bounds(n: int, global_batch: int, drop_last: bool) -> list[tuple[int, int]]:
    # the former definition, as a list
    full, rest = divmod(n, global_batch)
    bounds = [(i * global_batch, (i + 1) * global_batch) for i in range(full)]
    if rest and not drop_last:
        bounds.append((full * global_batch, n))
    return bounds


def listed_window_sizes(bounds: list[tuple[int, int]], steps: int, n_windows: int) -> list[int]:
    return [sum(bounds[j][1] - bounds[j][0] for j in window_micro_batches(w, steps, len(bounds)))
            for w in range(n_windows)]


@given(st.integers(1, 300), st.integers(1, 40), st.booleans(), st.integers(1, 6), st.integers(-1, 1))
def test_bounds_and_window_sizes_equal_the_listed_definitions(n: int, batch: int, drop_last: bool, steps: int,
                                                              extra: int) -> None:
    bounds = sampling.micro_batch_bounds(n, batch, drop_last)
    listed = listed_bounds(n, batch, drop_last)
    assert len(bounds) == len(listed) and list(bounds) == listed and bounds == listed
    n_windows = max(0, -(-len(listed) // steps) + extra)
    sizes = sampling.window_sizes(bounds, steps, n_windows)
    expected = listed_window_sizes(listed, steps, n_windows)
    assert [sizes[w] for w in range(n_windows)] == expected
    assert [sizes.first(k) for k in range(n_windows + 1)] == [sum(expected[:k]) for k in range(n_windows + 1)]
    assert sizes.total() == sum(expected)


def test_bounds_negative_control() -> None:
    # an off-by-one bound (the short last micro-batch dropped although drop_last is False) is caught
    assert Bounds(10, 4, drop_last=True) != listed_bounds(10, 4, drop_last=False)
    with pytest.raises(IndexError):
        Bounds(10, 4, drop_last=False)[3]
