"""The divergence ledger (docs/divergences.md) as data: which row explains a failing case.

Each ledger row is a Markdown table row whose first cell is its id (`O-NADAM`, `S-TMAX`, ...). The
case ids a row names are its backticked words that look like case ids: `loss/mse-*` (a glob over
ids), or, inside a section of one kind, a bare `torch-sgd-closed` (that kind's
`optimizer/torch-sgd-closed`); `{a,b}` alternatives are expanded. A native backend's failure is
explained when a row names its case (`explain`); the reports show that row beside the failure, and
`audit` gives the two checks of an executable ledger: failures no row explains, rows that no
longer show.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEDGER_FILE = Path(__file__).resolve().parents[2] / "docs" / "divergences.md"  # absent in a wheel
KINDS = ("loss", "schedule", "optimizer", "clip", "accumulate", "loss_scale", "train")
SECTION_KINDS = {"losses": "loss", "optimizers": "optimizer", "schedules": "schedule",
                 "accumulation": "accumulate", "clipping": "clip", "precision": "loss_scale"}

_ROW = re.compile(r"^\|\s*([A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+)\s*\|")
_ANCHOR = re.compile(r'<a id="([a-z_-]+)"></a>')
_TICKED = re.compile(r"`([^`\s]+)`")
_CASE_WORD = re.compile(r"^[a-z*][a-z0-9*?\[\]{},._-]*$")


@dataclass(frozen=True)
class LedgerRow:
    id: str
    kind: str | None  # the kind of the section the row is in
    cases: tuple[str, ...]  # case-id globs the row names


def _expand(word: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", word)
    if m is None:
        return [word]
    return [w for alt in m.group(1).split(",") for w in _expand(word[:m.start()] + alt + word[m.end():])]


def _case_globs(text: str, kind: str | None) -> tuple[str, ...]:
    out: list[str] = []
    for word in _TICKED.findall(text):
        head, _, rest = word.partition("/")
        if rest and head in KINDS:
            out.extend(_expand(word))
        elif kind is not None and not rest and _CASE_WORD.match(word) and not word.startswith("test_") \
                and "-" in word and not word.endswith(".py"):
            out.extend(f"{kind}/{w}" for w in _expand(word))
    return tuple(dict.fromkeys(out))


def parse_ledger(text: str) -> list[LedgerRow]:
    rows: list[LedgerRow] = []
    kind: str | None = None
    for line in text.splitlines():
        anchor = _ANCHOR.search(line)
        if anchor:
            kind = SECTION_KINDS.get(anchor.group(1))
        m = _ROW.match(line)
        if m:
            rows.append(LedgerRow(m.group(1), kind, _case_globs(line[m.end():], kind)))
    return rows


def read_ledger(path: str | Path | None = None) -> list[LedgerRow]:
    """The rows of the ledger file (default: docs/divergences.md beside the package; [] if absent)."""
    path = Path(path) if path is not None else LEDGER_FILE
    try:
        return parse_ledger(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []


def explain(rows: list[LedgerRow], case_id: str) -> list[str]:
    """The ids of the rows that name `case_id`."""
    return [r.id for r in rows if any(fnmatch.fnmatchcase(case_id, g) for g in r.cases)]


def audit(results: Iterable[Any], rows: list[LedgerRow], backend: str) -> tuple[list[str], list[str]]:
    """The executable ledger's two checks for one (native) backend's results (objects with `case`,
    `backend`, `status`): the failed case ids no row names, and the ids of the rows that name at
    least one case the backend ran but none that failed (a divergence that has stopped showing)."""
    mine = [r for r in results if r.backend == backend]
    failed = {r.case for r in mine if r.status == "failed"}
    ran = {r.case for r in mine}
    unexplained = sorted(c for c in failed if not explain(rows, c))
    stale = [row.id for row in rows
             if any(fnmatch.fnmatchcase(c, g) for c in ran for g in row.cases)
             and not any(fnmatch.fnmatchcase(c, g) for c in failed for g in row.cases)]
    return unexplained, stale
