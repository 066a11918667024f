"""Backend plumbing: dtypes, devices, NumPy conversion and the numerics context for conformance runs."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from conformance import heap
from conformance.errors import UnsupportedError

__all__ = ["NAME", "context", "describe", "framework_dtype", "release", "share_compiled", "to_numpy"]

NAME = "jax"

_DTYPES = {
    "float64": jnp.float64,
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
}


def framework_dtype(name: str) -> Any:
    """The framework dtype for a spec dtype name ("float64", "float32", "bfloat16", "float16")."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise UnsupportedError(f"dtype {name!r} is not one of {', '.join(_DTYPES)}") from None


def to_numpy(x: Any) -> np.ndarray:
    """A tensor (any dtype, any device) as a float64 NumPy array; bool and int arrays keep their kind."""
    arr = np.asarray(jax.device_get(x))
    if np.issubdtype(arr.dtype, np.floating) or arr.dtype == jnp.bfloat16:
        return arr.astype(np.float64)
    return arr


@contextlib.contextmanager
def context() -> Iterator[None]:
    """Numerics for conformance runs: float32 matmuls at full precision (no TF32) and 64-bit
    types available; the previous settings are restored afterwards."""
    with jax.enable_x64(True), jax.default_matmul_precision("highest"):
        yield


def release() -> None:
    """Drop what is kept between conformance cases (compiled programs) and give the freed memory
    back to the operating system: a run compiles over a thousand small programs."""
    jax.clear_caches()  # XLA:CPU keeps ~1.4 MB per program
    heap.trim()


def share_compiled(directory: str) -> None:
    """Keep compiled programs in `directory`, which every worker process of a conformance run
    shares: a program another worker (or this one, before a release) compiled is loaded from there,
    not compiled again. It is the same executable, so the same bits. Called once, at the start of a
    worker process that runs only cases; a compilation cache the user configured
    (JAX_COMPILATION_CACHE_DIR) is used as it is."""
    if jax.config.jax_compilation_cache_dir:
        return
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the cases' programs are all small
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    # JAX writes an entry in place (its file lock comes with size-based eviction, which doubles the
    # run's time): a worker that reads an entry another is still writing compiles the program
    # itself, with a warning that is noise here
    warnings.filterwarnings("ignore", message="Error reading persistent compilation cache entry")


def describe() -> dict[str, Any]:
    """Versions and numerics settings, recorded in reports and checkpoints."""
    import flax
    import optax

    return {
        "backend": NAME,
        "jax": jax.__version__,
        "optax": optax.__version__,
        "flax": flax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "x64": bool(jax.config.jax_enable_x64),
        "default_matmul_precision": jax.config.jax_default_matmul_precision,
        "threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
    }
