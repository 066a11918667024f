"""When the weights' exponential moving average is updated, and in which dtype (config: [ema]).

Both trainers, both twins' `ema` modules and the oracle apply these; the update rule itself
(ema ← lerp(ema, p, 1 − decay), the first update a copy) is in each of them and in the docstring of
conformance/config/ema.py.
"""

from __future__ import annotations

from conformance.config.ema import EmaSpec


def ema_due(spec: EmaSpec, t: int) -> bool:
    """Whether the EMA is updated after update t (0-based), if that update is applied (a skipped
    update changes neither the weights nor the EMA): t ≥ start and (t − start) % every == 0."""
    return spec.decay is not None and t >= spec.start and (t - spec.start) % spec.every == 0


def ema_dtype(param_dtype: str) -> str:
    """The EMA's dtype: float64 for float64 weights, else float32 (bfloat16 and float16 weights too)."""
    return "float64" if param_dtype == "float64" else "float32"
