"""`[precision]`: compute dtype, master weights, dynamic loss scaling, non-finite policy."""

from __future__ import annotations

from typing import Literal

from conformance.spec.base import Section


class PrecisionSpec(Section):
    """(First cut: the mixed-precision issue completes it.)"""

    dtype: Literal["float64", "float32", "bfloat16", "float16"] = "float32"
    schedule_on_skip: Literal["hold", "advance"] = "hold"
