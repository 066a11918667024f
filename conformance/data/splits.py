"""What a loaded data set is, below every loader: its facts (DataInfo), its splits (ArraySplit,
TokenSplit, or any conformance.data.sources.MapData), the Dataset that holds them, how many samples
validate and which (`n_validation`, `random_split`), and the host-side check of a split's arrays.

A leaf of conformance.data: the built-in data sets (datasets.py), token shards (tokens.py), array
files (arrays.py) and data a user passes (user.py) all build these, and none of them imports another
to do so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from conformance.data.sampling import fingerprint, random_order
from conformance.data.sources import MapData
from conformance.errors import InputError
from conformance.rules.inputs import check_finite

Task = Literal["regression", "classification", "language_model"]


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about the data: task, input width, outputs (regression targets,
    classes or vocabulary size; None where the data cannot tell), text vocabulary and window
    length, split sizes and a fingerprint (sha256 over every array, so a resumed run can tell that
    its data did not change)."""

    name: str
    task: Task
    in_features: int | None
    out_features: int | None
    n_classes: int | None
    vocab: tuple[str, ...] | None
    block_size: int | None
    n_train: int
    n_val: int
    fingerprint: str


@dataclass(frozen=True)
class ArraySplit:
    """Samples stored as arrays: row i of x is an input, row i of y its target."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        # ndarray.take: the rows x[index] gives, at half the cost of fancy indexing
        return {"x": self.x.take(index, axis=0), "y": self.y.take(index, axis=0)}

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint(self.x, self.y)


@dataclass(frozen=True)
class TokenSplit:
    """Windows over a token stream: sample i is tokens[s:s+T] with targets tokens[s+1:s+T+1],
    s = starts[i] (targets are the inputs shifted by one)."""

    tokens: np.ndarray
    starts: np.ndarray
    block_size: int

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        rows = self.starts[index][:, None] + np.arange(self.block_size + 1)
        # two gathers: contiguous inputs and targets (slices of one window would make every framework copy)
        return {"x": self.tokens[rows[:, :-1]], "y": self.tokens[rows[:, 1:]]}

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint(self.tokens, self.starts, label=f"windows:{self.block_size}")


Split = MapData


@dataclass(frozen=True)
class Dataset:
    """A loaded data set: its train and validation splits and its DataInfo."""

    train: Split
    val: Split
    info: DataInfo


def n_validation(n: int, fraction: float) -> int:
    """Validation samples out of n: round-half-up of n·fraction, at least 1 when fraction > 0."""
    if fraction <= 0:
        return 0
    return max(1, int(math.floor(n * fraction + 0.5)))


def random_split(n: int, n_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # The last n_val of a seeded permutation; each part keeps the original sample order.
    order = random_order(seed, "split", n)
    return np.sort(order[: n - n_val]), np.sort(order[n - n_val :])


def check_split(dataset: str, split: str, x: np.ndarray, y: np.ndarray, task: Task, n_out: int) -> None:
    """Host-side validation, once per data set: finite inputs, finite regression targets, integer
    labels or tokens in range. Raises InputError naming the data set, split and index."""
    where = f"{dataset} {split}"
    if x.shape[0] != y.shape[0]:
        raise InputError(f"{where}: {x.shape[0]} inputs but {y.shape[0]} targets")
    if np.issubdtype(x.dtype, np.floating):
        check_finite(f"{where} inputs", x)
    if task == "regression":
        check_finite(f"{where} targets", y)
        return
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"{where} labels must be integers; received {y.dtype}")
    bad = (y < 0) | (y >= n_out)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        kind = "token" if task == "language_model" else "label"
        raise InputError(f"{where} {kind} {int(y[at])} at index {at} is out of range 0..{n_out - 1}")
