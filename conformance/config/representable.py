"""Every float hyper-parameter a run casts to its parameters' dtype must be a number that dtype holds.

A float32 run's optimizer, schedule, clipping, loss-scaling, EMA and loss settings reach the
framework as float32 scalars: torch refuses `lr = 1e39` mid-run ("value cannot be converted to type
float without overflow") and JAX casts it to inf and skips every update. Both are refused here,
before anything runs, naming the field: a value above the dtype's largest finite number, and a
non-zero value that rounds to 0 in it (an `eps = 1e-50` that silently becomes no eps at all).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

# The sections whose floats become the parameters' dtype inside an update (data and model settings
# stay host-side Python / NumPy float64 numbers).
CAST_SECTIONS: tuple[str, ...] = ("optimizer", "schedule", "clip", "precision", "ema", "loss")


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
    largest, smallest = float(info.max), float(info.smallest_subnormal)
    for name, settings in sections.items():
        for where, value in _floats(settings, name):
            if abs(value) > largest:
                return (f"{where} = {value:g} does not fit {dtype}, the dtype of this run's parameters and "
                        f"optimizer state (largest finite value {largest:g}); choose a smaller value, or "
                        f"[precision] dtype = \"float64\"")
            if value != 0.0 and abs(value) < smallest / 2:
                return (f"{where} = {value:g} rounds to 0 in {dtype}, the dtype of this run's parameters and "
                        f"optimizer state (smallest positive value {smallest:g}); choose a larger value, or 0")
    return None
