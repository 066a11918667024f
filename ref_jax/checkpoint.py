"""Move model weights and RNG state between framework objects and the neutral checkpoint dicts.

    tensors = model_state(model)           # {neutral name: ndarray}, the parameters' own dtype
    load_model_state(model, tensors)       # strict: same names, shapes and dtypes, else CheckpointError
    rng, meta = capture_rng(source)        # the framework's generators + Python's and NumPy's
    generator = restore_rng(rng, meta)

torch: capture_rng() captures the global generators (CPU and every initialised CUDA device);
JAX: capture_rng(key) the key's raw uint32 data and its impl, and restore_rng returns the key.
Optimizer, scheduler and loss-scale states arrive already neutral (their modules export them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from conformance.checkpoint import check_tensors
from conformance.checkpoint.files import load_tensors, save_tensors
from conformance.checkpoint.rng import capture_host_rng, restore_host_rng
from conformance.errors import CheckpointError
from ref_jax._nnx import param_paths
from ref_jax.models import named_parameters

__all__ = [
    "capture_rng", "export_weights", "import_weights", "load_model_state", "model_state", "restore_rng",
]


def model_state(model: Any) -> dict[str, np.ndarray]:
    """The model's parameters as {neutral name: NumPy array} in their own dtype (a copy)."""
    return {name: np.array(jax.device_get(p)) for name, p in named_parameters(model).items()}


def load_model_state(model: Any, tensors: dict[str, np.ndarray]) -> None:
    """Copy neutral tensors into the model in place. Names, shapes and dtypes must match exactly;
    otherwise CheckpointError names the first offending tensor and nothing is changed."""
    params = named_parameters(model)
    check_tensors({n: (tuple(p.shape), jnp.dtype(p.dtype).name) for n, p in params.items()}, tensors)
    paths = param_paths(model)
    # Keep each parameter where it lives (device or sharding) while replacing its value.
    updates = [(paths[n], jax.device_put(np.asarray(tensors[n]), getattr(p, "sharding", None)))
               for n, p in params.items()]
    nnx.update(model, nnx.from_flat_state(updates))


def export_weights(model: Any, path: str | Path) -> None:
    """Write the model's parameters to a safetensors file (neutral names), atomically."""
    save_tensors(path, model_state(model))


def import_weights(model: Any, path: str | Path) -> None:
    """Load a safetensors file of neutral parameters into the model (strict, as load_model_state)."""
    load_model_state(model, load_tensors(path))


def capture_rng(source: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Capture RNG state as neutral tensors (uint8/uint32) plus JSON metadata. `source` is the
    framework's own generator state: None for torch's global generators (CPU and every initialised
    CUDA device), a torch.Generator, or a JAX PRNG key; Python's and NumPy's global generators are
    always included."""
    tensors, meta = capture_host_rng()
    if source is None:
        return tensors, meta  # JAX keeps no global generator state
    if isinstance(source, jax.Array) and jnp.issubdtype(source.dtype, jax.dtypes.prng_key):
        tensors["jax_key"] = np.asarray(jax.device_get(jax.random.key_data(source)), np.uint32)
        meta["jax_key"] = {"impl": str(jax.random.key_impl(source)), "typed": True}
    elif isinstance(source, (jax.Array, np.ndarray)) and source.dtype == np.uint32:
        tensors["jax_key"] = np.asarray(jax.device_get(source), np.uint32)
        meta["jax_key"] = {"impl": "threefry2x32", "typed": False}  # a raw jax.random.PRNGKey
    else:
        raise CheckpointError(f"capture_rng: source must be None or a JAX PRNG key; received {type(source).__name__}")
    return tensors, meta


def restore_rng(tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> Any:
    """Restore what capture_rng captured (states of the other framework are ignored). Returns the
    restored generator or key when the capture had a `source`, else None."""
    restore_host_rng(tensors, meta)
    if "jax_key" not in tensors:
        return None
    info = meta.get("jax_key", {})
    data = jnp.asarray(np.asarray(tensors["jax_key"], np.uint32))
    if not info.get("typed", True):
        return data
    try:
        return jax.random.wrap_key_data(data, impl=info.get("impl", "threefry2x32"))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint tensor rng/jax_key does not fit impl {info.get('impl')!r} ({exc})") from None
