"""`[schedule]`: the learning rate as a function of the update count t (CONTRACT.md §2).

(First cut: the schedules issue fills in every schedule's fields and checks.)
"""

from __future__ import annotations

from typing import Literal

from conformance.spec.base import Section

ScheduleName = Literal[
    "constant", "step", "multistep", "exponential", "cosine", "linear", "polynomial", "onecycle",
    "cosine_restarts", "warmup_cosine", "inverse_sqrt", "wsd", "sequential",
]
SCHEDULE_NAMES: tuple[str, ...] = ScheduleName.__args__  # type: ignore[attr-defined]


class ScheduleSpec(Section):
    name: ScheduleName = "constant"
