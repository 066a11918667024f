"""Run events: named moments of a run that an observer may watch (progress, profiling, fault tests).

`train(..., events=fn)` and `save_checkpoint(..., events=fn)` call `fn(name, info)` at each moment:

    "micro_batch"  {"update": t, "index": j}  torch: before micro-batch j of update t runs forward
    "dispatched"   {"update": t}              JAX: update t's whole window is launched on the device
                                              (it runs as one compiled call), its results not yet read
    "checkpoint"   {"stage": s}               inside a save, s in CHECKPOINT_STAGES (in this order)

An observer must not change the run; raising from it stops the run there (an exception propagates as
from any other line of the loop). Kill tests observe with a function that exits the process at one
named moment (tests/support/faults.py), which is how a crash at an exact point is produced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Events = Callable[[str, Mapping[str, Any]], None]

CHECKPOINT_STAGES: tuple[str, ...] = (
    "after_first_file", "during_files", "before_manifest", "after_manifest", "after_rename", "during_retention",
)


def notify(events: Events | None, name: str, **info: Any) -> None:
    """Tell `events` (if any) that moment `name` has come, with `info`."""
    if events is not None:
        events(name, info)
