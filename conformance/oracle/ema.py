"""The exponential moving average of the weights in NumPy float64 (conformance/config/ema.py):

    after an applied update t with t ≥ start and (t − start) % every == 0:
        first time: ema ← p;   afterwards: ema ← decay·ema + (1 − decay)·p
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance.config.ema import EmaSpec
from conformance.rules.ema import ema_due


def update_ema(spec: EmaSpec, ema: Mapping[str, np.ndarray] | None, params: Mapping[str, np.ndarray],
               t: int) -> dict[str, np.ndarray] | None:
    """The EMA after update t (None: not started yet)."""
    if not ema_due(spec, t):
        return None if ema is None else dict(ema)
    if ema is None:
        return {k: np.array(v, np.float64) for k, v in params.items()}
    d = spec.decay
    return {k: d * ema[k] + (1 - d) * np.asarray(params[k], np.float64) for k in ema}
