"""`[accumulation]`: micro-batches per optimizer update and how the window is normalized."""

from __future__ import annotations

from typing import Literal

from conformance.spec.base import PosInt, Section


class AccumulationSpec(Section):
    """(First cut: the accumulation issue completes it.)"""

    steps: PosInt = 1
    normalize: Literal["micro_batches", "tokens"] = "micro_batches"
