"""torch.nn.utils's clipping for a [clip] spec: clip_grad_norm_ (global, or one call per parameter),
clip_grad_value_, and get_total_norm for the norm before clipping.

clip_grad_norm_'s eps is fixed at 1e-6 (any other `eps` is unsupported); its RuntimeError for a
non-finite norm under error_if_nonfinite is the protocol's NonFiniteError with torch's message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from conformance.config import ClipSpec
from conformance.config.clip import TORCH_EPS
from conformance.errors import NonFiniteError
from natives._protocol import require
from natives.torch_native.backend import dtype_of, to_numpy


def clip(spec: ClipSpec, params: list[torch.Tensor]) -> float:
    """Clip the `.grad` of `params` in place as the spec says; the total norm before clipping."""
    require(spec, "clip", "eps", (TORCH_EPS,), "torch.nn.utils.clip_grad_norm_ (eps fixed at 1e-6)")
    require(spec, "clip", "target", ("gradients",), "torch.nn.utils (it clips .grad, before the step)")
    grads = [p.grad for p in params]
    norm = float(torch.nn.utils.get_total_norm(grads, spec.norm_type))
    try:
        if spec.clip_value is not None:  # with max_norm as well: the two calls, value first
            torch.nn.utils.clip_grad_value_(params, spec.clip_value)
        if spec.mode == "global_norm":
            torch.nn.utils.clip_grad_norm_(params, spec.max_norm, spec.norm_type, spec.error_if_nonfinite)
        elif spec.mode == "per_parameter":
            for p in params:
                torch.nn.utils.clip_grad_norm_([p], spec.max_norm, spec.norm_type, spec.error_if_nonfinite)
    except RuntimeError as exc:
        if not spec.error_if_nonfinite:
            raise
        raise NonFiniteError(f"torch.nn.utils.clip_grad_norm_: {exc}") from None
    return norm


def clip_and_norm(spec: ClipSpec, grads: Mapping[str, np.ndarray], dtype: str = "float64") -> dict[str, Any]:
    """The clipped gradients and the norm before clipping, by torch.nn.utils."""
    dt = dtype_of(dtype)
    params = {}
    for name, g in grads.items():
        p = torch.nn.Parameter(torch.zeros(np.shape(g), dtype=dt))
        p.grad = torch.tensor(np.asarray(g, np.float64), dtype=dt)
        params[name] = p
    norm = clip(spec, list(params.values()))
    return {"grads": {k: to_numpy(p.grad) for k, p in params.items()}, "total_norm": norm}
