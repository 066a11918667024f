"""The divergence ledger (docs/divergences.md) as data: which row explains a failing case.

Each ledger row is a Markdown table row whose first cell is its id (`O-NADAM`, `S-TMAX`, ...). The
case ids a row names are its backticked words that look like case ids: `loss/mse-*` (a glob over
ids), or, inside a section of one kind, a bare `torch-sgd-closed` (that kind's
`optimizer/torch-sgd-closed`); `{a,b}` alternatives are expanded.

A row also says, machine-readably, which cases each native backend (natives/) fails because of it:
`**optax-native fails** `optimizer/torch-nadam-open`, `optimizer/torch-nadam-{closed,groups}``
(full case ids or globs). That is the executable ledger: `audit` gives, for one backend's results,
the failures no row lists for that backend, and the listed cases that no longer fail (a divergence
that has stopped showing, or a listed id the suite does not have). `explain` names the rows of a
failure for the reports: the rows that list the case for that backend, else (an outside backend)
every row that names the case.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

LEDGER_FILE = Path(__file__).resolve().parents[2] / "docs" / "divergences.md"  # absent in a wheel
KINDS = ("loss", "schedule", "optimizer", "clip", "accumulate", "loss_scale", "train")
SECTION_KINDS = {"losses": "loss", "optimizers": "optimizer", "schedules": "schedule",
                 "accumulation": "accumulate", "clipping": "clip", "precision": "loss_scale"}

_ROW = re.compile(r"^\|\s*([A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+)\s*\|")
_ANCHOR = re.compile(r'<a id="([a-z0-9_-]+)"></a>')
_TICKED = re.compile(r"`([^`\s]+)`")
_CASE_WORD = re.compile(r"^[a-z*][a-z0-9*?\[\]{},._-]*$")
_FAILS = re.compile(r"\*\*([a-z][a-z0-9._-]*) fails\*\*((?:[\s,]*`[^`\s]+`)+)")
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class LedgerRow:
    id: str
    kind: str | None  # the kind of the section the row is in
    cases: tuple[str, ...]  # case-id globs the row names
    fails: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (native backend, the case globs it fails)

    def failing(self, backend: str) -> tuple[str, ...]:
        """The case globs this row says `backend` fails."""
        return tuple(g for b, globs in self.fails if b == backend for g in globs)


class Audit(NamedTuple):
    unexplained: list[str]  # failed case ids no row lists for the backend
    stale: list[str]  # "ROW: case status": listed cases that do not fail (passed, unsupported, absent)


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


def _fails(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    out: dict[str, list[str]] = {}
    for backend, words in _FAILS.findall(text):
        for word in _TICKED.findall(words):
            out.setdefault(backend, []).extend(_expand(word))
    return tuple((b, tuple(dict.fromkeys(g))) for b, g in out.items())


def parse_ledger(text: str) -> list[LedgerRow]:
    rows: list[LedgerRow] = []
    kind: str | None = None
    for line in text.splitlines():
        anchor = _ANCHOR.search(line)
        if anchor:
            kind = SECTION_KINDS.get(anchor.group(1))
        m = _ROW.match(line)
        if m:
            rest = line[m.end():]
            rows.append(LedgerRow(m.group(1), kind, _case_globs(rest, kind), _fails(rest)))
    return rows


def read_ledger(path: str | Path | None = None) -> list[LedgerRow]:
    """The rows of the ledger file (default: docs/divergences.md beside the package; [] if absent)."""
    path = Path(path) if path is not None else LEDGER_FILE
    try:
        return parse_ledger(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []


def _match(case_id: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(case_id, g) for g in globs)


def explain(rows: list[LedgerRow], case_id: str, backend: str | None = None) -> list[str]:
    """The ids of the rows that list `case_id` as a failure of `backend`; when no row lists anything
    for `backend` (or none is given), the rows that name `case_id` at all."""
    if backend is not None and any(r.failing(backend) for r in rows):
        return [r.id for r in rows if _match(case_id, r.failing(backend))]
    return [r.id for r in rows if _match(case_id, r.cases)]


def audit(results: Iterable[Any], rows: list[LedgerRow], backend: str) -> Audit:
    """The executable ledger's two checks for one native backend's results (objects with `case`,
    `backend`, `status`): the failed case ids no row lists for it; and every case a row lists for it
    that did not fail: an exact id whose result is not a failure (or that the results lack), a glob
    that matches a passed case, or a glob that matches no failure at all."""
    status = {r.case: r.status for r in results if r.backend == backend}
    failed = sorted(c for c, s in status.items() if s == "failed")
    unexplained = [c for c in failed if not any(_match(c, r.failing(backend)) for r in rows)]
    stale: list[str] = []
    for row in rows:
        for glob in row.failing(backend):
            if not _GLOB.search(glob):
                if status.get(glob) != "failed":
                    stale.append(f"{row.id}: {glob} {status.get(glob, 'absent')}")
                continue
            hits = {c: s for c, s in status.items() if fnmatch.fnmatchcase(c, glob)}
            stale += [f"{row.id}: {c} passed" for c, s in sorted(hits.items()) if s == "passed"]
            if "failed" not in hits.values():
                stale.append(f"{row.id}: {glob} matches no failure")
    return Audit(unexplained, stale)
