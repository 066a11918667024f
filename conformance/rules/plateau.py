"""reduce_on_plateau's neutral state: what a checkpoint holds so either trainer resumes it exactly.

    {"best": 0.52 | "inf" | "-inf" | "nan", "num_bad_epochs": 2, "cooldown_counter": 0,
     "observed": 7, "lrs": [0.01, 0.001]}

`best` is the best metric so far (torch's ReduceLROnPlateau starts it at +inf for mode "min",
-inf for "max"; JSON has no infinities, so non-finite values are strings, as in metrics.jsonl),
`num_bad_epochs` and `cooldown_counter` torch's counters, `observed` how many metrics it has seen
(torch's last_epoch), `lrs` every group's current lr (its base lr reduced by every `factor`
applied so far, floored at min_lr), in the order of conformance.rules.groups.group_base_lrs.
It lives in a checkpoint's state.json under `schedule.plateau`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from conformance.config.schedule import ScheduleSpec
from conformance.errors import CheckpointError

KEYS = ("best", "num_bad_epochs", "cooldown_counter", "observed", "lrs")


class Plateau(NamedTuple):
    """The neutral plateau state, as plain Python numbers."""

    best: float
    num_bad_epochs: int
    cooldown_counter: int
    observed: int
    lrs: tuple[float, ...]


def initial(schedule: ScheduleSpec, lrs: list[float]) -> Plateau:
    """Before any metric: best is the worst value of the mode (torch's mode_worse)."""
    return Plateau(math.inf if schedule.mode == "min" else -math.inf, 0, 0, 0, tuple(float(x) for x in lrs))


def _number(x: float) -> float | str:
    return float(x) if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def to_json(state: Plateau) -> dict[str, Any]:
    """The state as JSON-safe values (non-finite best as a string)."""
    return {"best": _number(state.best), "num_bad_epochs": int(state.num_bad_epochs),
            "cooldown_counter": int(state.cooldown_counter), "observed": int(state.observed),
            "lrs": [float(x) for x in state.lrs]}


def floors(schedule: ScheduleSpec, groups: int) -> list[float]:
    """min_lr as one floor per parameter group, in group order (a single number applies to all)."""
    if isinstance(schedule.min_lr, list):
        return [float(x) for x in schedule.min_lr]
    return [float(schedule.min_lr or 0.0)] * groups


def from_json(data: Any, groups: int, where: str) -> Plateau:
    """Read `to_json`'s form back; CheckpointError naming `where` if it is not that."""
    if not isinstance(data, dict) or set(data) != set(KEYS):
        raise CheckpointError(f"{where}: schedule.plateau must hold exactly {', '.join(KEYS)}; received {data!r}")
    best = data["best"]
    if isinstance(best, str) and best in ("inf", "-inf", "nan"):
        best = float(best)
    lrs = data["lrs"]
    counts = [data[k] for k in ("num_bad_epochs", "cooldown_counter", "observed")]
    if (isinstance(best, bool) or not isinstance(best, (int, float))
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts)
            or not isinstance(lrs, list) or len(lrs) != groups
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in lrs)):
        raise CheckpointError(f"{where}: schedule.plateau is malformed (best a number, counters integers >= 0, "
                              f"lrs {groups} finite numbers); received {data!r}")
    return Plateau(float(best), *counts, tuple(float(x) for x in lrs))  # type: ignore[arg-type]


def from_meta(meta: dict[str, Any], groups: int, where: str) -> Plateau:
    """The plateau state of a checkpoint's state.json (a run with reduce_on_plateau must have one)."""
    saved = (meta.get("schedule") or {}).get("plateau")
    if saved is None:
        raise CheckpointError(f"{where}: state.json has no schedule.plateau, but this run's schedule is "
                              f"reduce_on_plateau (its best metric, counters and lrs are needed to resume)")
    return from_json(saved, groups, where)
