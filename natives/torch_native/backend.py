"""torch-native's numerics context and dtypes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from natives._protocol import refuse

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise refuse(f"dtype {name!r}", f"not one of {', '.join(DTYPES)}") from None


def to_numpy(x: Any) -> np.ndarray:
    return x.detach().double().numpy().copy()


@contextlib.contextmanager
def context() -> Iterator[None]:
    """float64 as torch's default dtype while a case runs, as a torch user who trains in float64
    sets it (torch.optim's scalars, e.g. NAdam's mu_product, follow it); restored afterwards."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def describe() -> dict[str, Any]:
    """The versions the report shows."""
    return {"backend": "torch-native", "torch": torch.__version__.split("+")[0]}
