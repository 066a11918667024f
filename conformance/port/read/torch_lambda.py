"""LambdaLR and MultiplicativeLR with any lr_lambda, sampled into a `tabulated` schedule.

A Python lambda has no closed form twinstep can read, but its values can be read: sampled at the
updates a run performs, they are a `tabulated` schedule that equals the scheduler there. LambdaLR's
lr is base · λ(t), the very product `tabulated` computes; MultiplicativeLR's lr is multiplied by
λ(t) at each step, so its factors are the running product λ(1) · … · λ(t) (the lr itself differs
from torch's step-by-step products by rounding only, about t ulps).

A SequentialLR part that is not the last is sampled over its own milestones, exactly and without
being asked. A scheduler that runs on (alone, or the last part) needs the run's length:
`from_torch(..., sample_updates=N)` samples updates 0 .. N − 1 and warns that from update N on the
table holds its last factor, where the lambda may go on changing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from conformance.errors import TwinstepWarning, UnsupportedError

ARBITRARY = "its lr_lambda is an arbitrary Python function whose mathematics twinstep cannot read"
HINT = ("pass sample_updates=N (the updates of the run) to sample it into an exact tabulated schedule, or write "
        "the [schedule] section by hand")


def _value(f: Callable[[int], Any], t: int, name: str) -> float:
    try:
        return float(f(t))
    except Exception as exc:  # noqa: BLE001 - the user's lambda: any error it raises is reported as its own
        raise UnsupportedError(f"{name}'s lr_lambda raised {type(exc).__name__} at update {t}: {exc}") from None


def _factors(f: Callable[[int], Any], name: str, updates: int) -> list[float]:
    """The factor of each group's base lr at updates 0 .. updates − 1."""
    if name == "LambdaLR":
        return [_value(f, t, name) for t in range(updates)]
    out = [1.0]  # MultiplicativeLR: update 0 keeps the lr, each later step multiplies it by λ(t)
    for t in range(1, updates):
        out.append(out[-1] * _value(f, t, name))
    return out


def sampled(scheduler: Any, name: str, updates: int | None, *, ends: bool = False, start: int = 0) -> dict[str, Any]:
    """The `tabulated` schedule of a LambdaLR / MultiplicativeLR over `updates` updates; `ends`: the
    scheduler stops there (a SequentialLR part before a milestone), so the table is exact throughout;
    `start`: the run's update where it starts (a SequentialLR part's milestone)."""
    if updates is None:
        raise UnsupportedError(f"{name} cannot be translated: {ARBITRARY}; {HINT}")
    tables = [_factors(f, name, updates) for f in scheduler.lr_lambdas]
    for i, table in enumerate(tables[1:], 1):
        if table != tables[0]:
            t = next(k for k, (a, b) in enumerate(zip(table, tables[0])) if a != b)
            raise UnsupportedError(f"{name} param group {i}'s lr_lambda gives the factor {table[t]!r} at update {t}, "
                                   f"group 0's {tables[0][t]!r}: a tabulated schedule multiplies every group's lr by "
                                   f"one table")
    if not ends:
        part = f" (the SequentialLR part from update {start})" if start else ""
        warnings.warn(f"{name}{part} sampled into a tabulated schedule for updates {start}..{start + updates - 1} "
                      f"(sample_updates = {start + updates}): exact there; from update {start + updates} on it holds "
                      f"the last factor "
                      f"{tables[0][-1]!r}, where the lr_lambda may go on changing", TwinstepWarning, stacklevel=5)
    return {"name": "tabulated", "factors": tables[0]}
