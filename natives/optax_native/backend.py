"""optax-native's numerics context and dtypes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from natives._protocol import refuse

DTYPES = {"float64": jnp.float64, "float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_of(name: str) -> Any:
    try:
        return DTYPES[name]
    except KeyError:
        raise refuse(f"dtype {name!r}", f"not one of {', '.join(DTYPES)}") from None


def to_numpy(x: Any) -> np.ndarray:
    return np.asarray(jax.device_get(x)).astype(np.float64)


@contextlib.contextmanager
def context() -> Iterator[None]:
    """64-bit types (a float64 case runs in float64) and full-precision float32 matmuls, as a JAX user
    who checks numerics sets them; restored afterwards."""
    with jax.enable_x64(True), jax.default_matmul_precision("highest"):
        yield


def describe() -> dict[str, Any]:
    """The versions the report shows."""
    import optax

    return {"backend": "optax-native", "optax": optax.__version__, "jax": jax.__version__}
