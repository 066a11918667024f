"""`[run]`: length of the run, device, seed, evaluation and logging cadence."""

from __future__ import annotations

from typing import Literal

from conformance.spec.base import NonNegInt, PosInt, Section


class RunSpec(Section):
    """(First cut: the trainer issue completes it.)"""

    seed: NonNegInt = 0
    epochs: PosInt = 5
    max_updates: PosInt | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    eval_every: NonNegInt = 0
    log_every: PosInt = 1
    compile: bool = False
