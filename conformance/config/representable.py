"""Every float hyper-parameter a run casts to its parameters' dtype must be a number that dtype holds.

A float32 run's optimizer, clipping, loss-scaling, EMA and loss settings reach the framework as
float32 scalars: torch refuses `lr = 1e39` mid-run ("value cannot be converted to type float without
overflow") and JAX casts it to inf and skips every update. Both are refused here, before anything
runs, naming the field: a value above the dtype's largest finite number. (A schedule's settings stay
Python floats: the lr they make is what reaches the optimizer. A tiny value that rounds to 0, as
torch and JAX both round it, is the same on both sides and is accepted.)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

# The sections whose floats become the parameters' dtype inside an update (data, model and schedule
# settings stay host-side Python / NumPy float64 numbers).
CAST_SECTIONS: tuple[str, ...] = ("optimizer", "clip", "precision", "ema", "loss")


def _floats(value: Any, where: str) -> Iterator[tuple[str, float]]:
    if isinstance(value, float) and math.isfinite(value):  # inf only where a field means it: clip.norm_type
        yield where, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _floats(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _floats(item, f"{where}[{i}]")


def unrepresentable(sections: Mapping[str, Any], dtype: str) -> str | None:
    """The first float of `sections` ({section name: its settings as plain data}) that `dtype`
    cannot hold, as a one-line reason naming the field; None when every one fits."""
    info = np.finfo(np.dtype(dtype))
    largest = float(info.max)
    for name, settings in sections.items():
        for where, value in _floats(settings, name):
            if abs(value) > largest:
                return (f"{where} = {value:g} does not fit {dtype}, the dtype of this run's parameters and "
                        f"optimizer state (largest finite value {largest:g}); choose a smaller value, or "
                        f"[precision] dtype = \"float64\"")
    return None
