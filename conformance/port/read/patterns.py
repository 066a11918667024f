"""Glob patterns that select exactly a given set of parameter names (for `[[optimizer.groups]]`).

A torch param group is a list of tensors; twinstep's groups are glob patterns over parameter names
(`fnmatch.fnmatchcase`, where `*` also matches dots). `cover(members, everyone)` finds, for one
group, a short list of patterns that matches every member and no other name: `*.bias` when every
bias is in the group, `encoder.*` for a whole sub-module, and exact (escaped) names otherwise.
"""

from __future__ import annotations

import fnmatch
import glob
from collections.abc import Iterable, Sequence


def _candidates(name: str) -> list[str]:
    """Patterns a name suggests: `*.<last parts>` suffixes and `<first parts>.*` prefixes."""
    parts = name.split(".")
    out = []
    for k in range(1, len(parts)):
        out.append("*." + glob.escape(".".join(parts[-k:])))
        out.append(glob.escape(".".join(parts[:k])) + ".*")
    return out


def _matches(pattern: str, names: Iterable[str]) -> set[str]:
    return {n for n in names if fnmatch.fnmatchcase(n, pattern)}


def cover(members: Sequence[str], everyone: Iterable[str]) -> list[str]:
    """Patterns matching every name of `members` and no other name of `everyone` (greedy set cover:
    the pattern that selects most uncovered members first, shorter first on ties; exact names last)."""
    group, universe = set(members), set(everyone) | set(members)
    usable: dict[str, set[str]] = {}
    for name in members:
        for pattern in _candidates(name):
            if pattern not in usable:
                hit = _matches(pattern, universe)
                if hit <= group:
                    usable[pattern] = hit
    left, chosen = set(group), []
    while left:
        best = max(usable.items(), key=lambda kv: (len(kv[1] & left), -len(kv[0])), default=None)
        if best is None or len(best[1] & left) < 2:
            break  # a pattern that selects one name is no clearer than the name itself
        chosen.append(best[0])
        left -= best[1]
    chosen.extend(glob.escape(n) for n in members if n in left)
    return chosen


def owner(name: str, groups: Sequence[Sequence[str]]) -> int | None:
    """The index of the first pattern list that matches `name` (None: no group)."""
    for i, patterns in enumerate(groups):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return i
    return None
