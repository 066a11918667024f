"""Backend plumbing: dtypes, devices, NumPy conversion and the numerics context for conformance runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from conformance import heap
from conformance.errors import UnsupportedError

__all__ = ["NAME", "context", "describe", "framework_dtype", "release", "share_compiled", "to_numpy"]

NAME = "torch"

_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def framework_dtype(name: str) -> Any:
    """The framework dtype for a spec dtype name ("float64", "float32", "bfloat16", "float16")."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise UnsupportedError(f"dtype {name!r} is not one of {', '.join(_DTYPES)}") from None


def to_numpy(x: Any) -> np.ndarray:
    """A tensor (any dtype, any device) as a float64 NumPy array; bool and int arrays keep their kind."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.is_floating_point():
            x = x.to(torch.float64)
        return x.cpu().numpy()
    return np.asarray(x)


@contextlib.contextmanager
def context() -> Iterator[None]:
    """Numerics for conformance runs: float32 matmuls at full precision (no TF32) and 64-bit
    types available; the previous settings are restored afterwards."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    cudnn = torch.backends.cudnn.allow_tf32
    precision = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn
        torch.set_float32_matmul_precision(precision)


def release() -> None:
    """Drop what is kept between conformance cases (compiled programs) and give the freed memory
    back to the operating system: a run compiles over a thousand small programs."""
    heap.trim()  # eager torch compiles nothing; the C heap keeps the pages of freed tensors


def share_compiled(directory: str) -> None:
    """Keep compiled programs in `directory`, which every worker process of a conformance run
    shares: a program another worker (or this one, before a release) compiled is loaded from there,
    not compiled again. It is the same executable, so the same bits. Called once, at the start of a
    worker process that runs only cases; a compilation cache the user configured
    (JAX_COMPILATION_CACHE_DIR) is used as it is."""
    del directory  # eager torch compiles nothing in a conformance run


def describe() -> dict[str, Any]:
    """Versions and numerics settings, recorded in reports and checkpoints."""
    return {
        "backend": NAME,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }
