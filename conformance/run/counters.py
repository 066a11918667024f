"""Run counters: how many updates a run has done, where its schedule stands, how many were skipped.

Saved in every checkpoint's state.json (docs/contract.md §2: a skipped update is counted, and advances the
schedule only with precision.schedule_on_skip = "advance").
"""

from __future__ import annotations

from typing import NamedTuple


class Counters(NamedTuple):
    """Run counters saved in every checkpoint (JSON)."""

    updates_done: int = 0
    schedule_t: int = 0  # the schedule's position: updates that advanced it
    skipped_total: int = 0
    consecutive_skips: int = 0
    best_val_loss: float | None = None


def advance(c: Counters, skipped: bool, schedule_advanced: bool) -> Counters:
    """Counters after one update (skipped or not)."""
    # positional construction: NamedTuple._replace costs several times more, once per update
    return Counters(c.updates_done + 1, c.schedule_t + int(schedule_advanced), c.skipped_total + int(skipped),
                    c.consecutive_skips + 1 if skipped else 0, c.best_val_loss)
