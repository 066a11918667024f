"""Array-valued fields of case files: nested TOML lists become validated NumPy arrays."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, ConfigDict, PlainSerializer
from pydantic_core import PydanticCustomError

from conformance.config.base import Section

DTYPES: dict[str, Any] = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
}


def numpy_dtype(name: str) -> Any:
    """NumPy dtype for a case dtype name; bfloat16 comes from ml_dtypes (a JAX dependency)."""
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return DTYPES[name]


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round a float array to `dtype` and back to float64, so every backend sees the same values."""
    if not np.issubdtype(x.dtype, np.floating):
        return x
    return np.asarray(x, dtype=numpy_dtype(dtype)).astype(np.float64)


def _to_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (dict, str)) or value is None:
        raise PydanticCustomError("array", "must be a number, a boolean or a nested list of them")
    try:
        arr = np.array(value)
    except ValueError:
        raise PydanticCustomError("array", "must be a rectangular nested list (rows of equal length)")
    if arr.dtype == object or arr.dtype.kind not in "biuf":
        raise PydanticCustomError(
            "array", "must be a rectangular nested list of numbers or booleans (rows of equal length)"
        )
    return arr


def _dump(arr: np.ndarray) -> Any:
    return arr.tolist()


Array = Annotated[np.ndarray, BeforeValidator(_to_array), PlainSerializer(_dump)]
"""A numeric array given as a nested TOML list (ints stay int64, floats are float64, booleans bool)."""

ParamSet = dict[str, Array]
"""A parameter set: parameter name -> array."""



class CaseTable(Section):
    """Base of `[inputs]` / `[expected]` models: strict, and allowed to hold NumPy arrays."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
