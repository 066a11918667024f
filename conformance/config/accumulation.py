"""`[accumulation]`: micro-batches per optimizer update and how the window is normalized.

    [accumulation]
    steps = 4                    # micro-batches per update
    normalize = "tokens"         # "micro_batches" | "tokens"
    last_window = "update"       # an incomplete last window: "update" with its real size, or "drop"

With micro-batch j of a window of n micro-batches giving LossOutput(value_j, sum_j, count_j):

- micro_batches: L = (1/n) Σ_j value_j, the mean of the micro-batch losses. n is the window's real
  size, so an incomplete last window is divided by its own count (seed 000's remainder correction).
- tokens: L = Σ_j sum_j / Σ_j count_j, every valid element of the window weighted equally: the
  full-batch mean (the fix of the 2024 gradient-accumulation bug). It always yields a mean, so it
  needs loss.reduction = "mean" or "batchmean" (`check_loss`).

Normalization happens once: each micro-batch backpropagates value_j / n or sum_j / N with the
window's N known before the first forward pass (counts come from targets and masks), so the
accumulated gradient is the gradient of L. Schedules and `update` count windows, not micro-batches.
"""

from __future__ import annotations

from typing import Literal

from conformance.config.base import PosInt, Section
from conformance.errors import ConfigError

Normalize = Literal["micro_batches", "tokens"]


class AccumulationSpec(Section):
    """Gradient accumulation over `steps` micro-batches per optimizer update."""

    steps: PosInt = 1
    normalize: Normalize = "micro_batches"
    last_window: Literal["update", "drop"] = "update"

    def windows(self, num_micro_batches: int) -> list[int]:
        """Sizes of the windows that `num_micro_batches` consecutive micro-batches form (one
        optimizer update each): full windows of `steps`, then the remainder unless dropped."""
        if num_micro_batches < 0:
            raise ConfigError(f"number of micro-batches must be >= 0; received {num_micro_batches}")
        full, rest = divmod(num_micro_batches, self.steps)
        sizes = [self.steps] * full
        if rest and self.last_window == "update":
            sizes.append(rest)
        return sizes

    def updates_per_epoch(self, num_micro_batches: int) -> int:
        """Optimizer updates in an epoch of `num_micro_batches` micro-batches."""
        return len(self.windows(num_micro_batches))

    def check_loss(self, reduction: str) -> None:
        """Raise ConfigError if the loss reduction does not fit this normalization."""
        if reduction == "none":
            raise ConfigError(
                "loss.reduction = 'none' gives no scalar to accumulate; use 'mean', 'sum' or 'batchmean'"
            )
        if self.normalize == "tokens" and reduction == "sum":
            raise ConfigError(
                "accumulation.normalize = 'tokens' divides the window's summed loss by its element "
                "count (a mean); it needs loss.reduction = 'mean' or 'batchmean', received 'sum'"
            )
