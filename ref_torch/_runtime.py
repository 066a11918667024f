"""Device, seeding, determinism, batch transfer and memory for the torch trainer."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from conformance.config import Config
from conformance.data import Batch
from conformance.errors import ConfigError


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """run.device: "auto" = CUDA when available (one device per local rank), else the CPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device = 'cuda', but torch.cuda.is_available() is False on this machine "
                          "(use 'auto' or 'cpu')")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"local rank {local_rank} has no CUDA device (this machine has {torch.cuda.device_count()})")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def seed_everything(seed: int) -> None:
    """Python's, NumPy's global and torch's (CPU and every CUDA device) generators seeded, so that
    what draws from them repeats from run to run. The data pipeline does not use them; dropout and
    user code do."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # torch.manual_seed's CPU and CUDA halves: without CUDA it would queue a lazy CUDA call (and
    # capture a stack trace for it) on every run
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


@contextlib.contextmanager
def determinism(enabled: bool, device: torch.device) -> Iterator[None]:
    """run.deterministic: deterministic kernels (needed for exact resume on CUDA; the CPU kernels used
    here are deterministic already). Restores the previous settings."""
    if not enabled:
        yield
        return
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


def to_device(batch: Batch, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A NumPy micro-batch as tensors: floating inputs/targets in the parameter dtype, integer labels
    and tokens as int64 (pinned and copied asynchronously on CUDA)."""
    out = []
    for a in (batch.x, batch.y):
        t = torch.from_numpy(np.ascontiguousarray(a))
        if t.is_floating_point():
            t = t.to(dtype)
        if device.type == "cuda":
            t = t.pin_memory().to(device, non_blocking=True)
        out.append(t)
    return out[0], out[1]


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory so far: CUDA's max allocated bytes on the device, else the process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def device_name(device: torch.device) -> str | None:
    """The accelerator's name for the MFU peak table (None on the CPU)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def maybe_compile(module: Any, config: Config) -> Any:
    """run.compile: torch.compile the forward (parameters stay on the bare module)."""
    if not config.run.compile:
        return module
    return torch.compile(module)
