"""Facts about a window of micro-batches that both trainers need before the forward pass.

- `window_counts(config, window)`: each micro-batch's valid-element count, from the targets alone,
  for accumulation.normalize = "tokens";
- `injected(config, t)`: `[run] inject_nonfinite`. Every micro-batch loss (value and sum) of a
  listed update is multiplied by +inf before the backward pass, so the window loss is +inf and
  the gradients non-finite, as in a float16 overflow.
"""

from __future__ import annotations

import numpy as np

from conformance.config import Config
from conformance.data import Window
from conformance.rules.inputs import INDEX_LOSSES, valid_count


def injected(config: Config, t: int) -> bool:
    """True when `[run] inject_nonfinite` lists update t (its losses are multiplied by +inf)."""
    return t in config.run.inject_nonfinite


def window_counts(config: Config, window: Window) -> list[float]:
    """Valid-element count of each micro-batch of the window (this rank's part), from the targets
    alone: what accumulation.normalize = "tokens" divides the window's summed loss by (before the
    all-rank reduction). Class targets (and gpt tokens) are counted per index, with class weights
    and ignore_index applied; other losses count every target element."""
    spec = config.loss
    out = []
    for b in window.batches:
        y = np.asarray(b.y)
        if spec.name in INDEX_LOSSES:
            # the loss sees (N, C) logits; a zero-stride stand-in gives valid_count the shape only
            y = y.reshape(-1)
            pred = np.broadcast_to(np.zeros(1), (y.shape[0], max(len(spec.weight or ()), 2)))
        else:
            pred = np.broadcast_to(np.zeros(1), y.shape)
        out.append(valid_count(spec, pred, y))
    return out
