"""Keras's import on its JAX backend, and the numerics context: JAX 64-bit types and Keras floatx
float64 (hyper-parameter variables such as the learning rate are floatx), restored afterwards."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

from conformance.errors import BackendError
from natives._protocol import refuse

DTYPES = ("float64", "float32", "bfloat16", "float16")


def load() -> ModuleType:
    """The keras module on its JAX backend (KERAS_BACKEND=jax when nothing chose one before)."""
    if "keras" not in sys.modules:
        os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        raise BackendError(f"the keras backend runs Keras on JAX; this process runs it on "
                           f"{keras.backend.backend()} (KERAS_BACKEND={os.environ.get('KERAS_BACKEND')})")
    return keras


def dtype_of(name: str) -> str:
    if name not in DTYPES:
        raise refuse(f"dtype {name!r}", f"not one of {', '.join(DTYPES)}")
    return name


def to_numpy(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


@contextlib.contextmanager
def context() -> Iterator[None]:
    import jax

    keras = load()
    before = keras.config.floatx()
    with jax.enable_x64(True), jax.default_matmul_precision("highest"):
        keras.config.set_floatx("float64")
        try:
            yield
        finally:
            keras.config.set_floatx(before)


def describe() -> dict[str, Any]:
    """The versions the report shows."""
    import jax

    keras = load()
    return {"backend": "keras", "keras": keras.__version__, "keras backend": keras.backend.backend(),
            "jax": jax.__version__}
