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

import numpy as np
import torch

from conformance.checkpoint import check_tensors
from conformance.checkpoint.files import load_tensors, save_tensors
from conformance.checkpoint.rng import capture_host_rng, restore_host_rng
from conformance.errors import CheckpointError
from ref_torch._arrays import native_numpy
from ref_torch.models import named_parameters

__all__ = [
    "capture_rng", "export_weights", "import_weights", "load_model_state", "model_state", "restore_rng",
]


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def model_state(model: Any) -> dict[str, np.ndarray]:
    """The model's parameters as {neutral name: NumPy array} in their own dtype (a copy)."""
    return {name: native_numpy(p) for name, p in named_parameters(model).items()}


def load_model_state(model: Any, tensors: dict[str, np.ndarray]) -> None:
    """Copy neutral tensors into the model in place. Names, shapes and dtypes must match exactly;
    otherwise CheckpointError names the first offending tensor and nothing is changed."""
    params = named_parameters(model)
    check_tensors({n: (tuple(p.shape), _dtype_name(p)) for n, p in params.items()}, tensors)
    with torch.no_grad():
        for name, p in params.items():
            arr = np.ascontiguousarray(tensors[name])
            if arr.dtype.name == "bfloat16":
                src = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
            else:
                src = torch.from_numpy(arr.copy())
            p.copy_(src)


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
        tensors["torch_cpu"] = torch.get_rng_state().numpy().copy()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            for i in range(torch.cuda.device_count()):
                tensors[f"torch_cuda_{i}"] = torch.cuda.get_rng_state(i).numpy().copy()
    elif isinstance(source, torch.Generator):
        tensors["torch_generator"] = source.get_state().numpy().copy()
        meta["torch_generator"] = {"device": str(source.device)}
    else:
        raise CheckpointError(
            f"capture_rng: source must be None or a torch.Generator; received {type(source).__name__}"
        )
    return tensors, meta


def restore_rng(tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> Any:
    """Restore what capture_rng captured (states of the other framework are ignored). Returns the
    restored generator or key when the capture had a `source`, else None."""
    restore_host_rng(tensors, meta)
    if "torch_cpu" in tensors:
        torch.set_rng_state(torch.from_numpy(np.asarray(tensors["torch_cpu"], np.uint8).copy()))
    cuda = sorted(k for k in tensors if k.startswith("torch_cuda_"))
    if cuda and torch.cuda.is_available():
        if len(cuda) > torch.cuda.device_count():
            raise CheckpointError(f"checkpoint has RNG state for {len(cuda)} CUDA devices; this machine has "
                                  f"{torch.cuda.device_count()}")
        for key in cuda:
            state = torch.from_numpy(np.asarray(tensors[key], np.uint8).copy())
            torch.cuda.set_rng_state(state, int(key.rsplit("_", 1)[1]))
    if "torch_generator" not in tensors:
        return None
    gen = torch.Generator(device=meta.get("torch_generator", {}).get("device", "cpu"))
    gen.set_state(torch.from_numpy(np.asarray(tensors["torch_generator"], np.uint8).copy()))
    return gen
