"""The reference loss of the built-in gpt for tests: weights by neutral name loaded into ref_torch's
model, the mean token cross-entropy over (inputs, targets) token arrays computed with
F.cross_entropy in float64 on its logits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from conformance.data import DataPipeline
from ref_torch.models import build_model


def mean_token_loss(config: Any, params: dict[str, np.ndarray], rows: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """Σ token losses / Σ tokens of `config`'s gpt with `params` over the (x, y) pairs in `rows`."""
    model = build_model(config.model, DataPipeline(config).info)
    total, count = 0.0, 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
        for x, y in rows:
            logits = model(torch.from_numpy(x))
            total += float(F.cross_entropy(logits.flatten(0, 1).double(), torch.from_numpy(y).flatten(), reduction="sum"))
            count += y.size
    return total / count
