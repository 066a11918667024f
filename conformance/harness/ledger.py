"""The divergence ledger (docs/divergences.md) as data: which row explains a failing case.

Each ledger row is a Markdown table row whose first cell is its id (`O-NADAM`, `S-TMAX`, ...). The
case ids a row names are its backticked words that look like case ids: `loss/mse-*` (a glob over
ids), or, inside a section of one kind, a bare `torch-sgd-closed` (that kind's
`optimizer/torch-sgd-closed`); `{a,b}` alternatives are expanded.

A row also says, machine-readably, which cases each native backend (natives/) fails because of it:
`**optax-native fails** (rel ≤ 1) `optimizer/torch-nadam-open`, `optimizer/torch-{adam,radam}-open``
(full case ids or globs). Each list says how those cases fail, in parentheses after the marker:
`(rel ≤ 1e-7)` or `(abs ≤ 1e-12)` (a numeric difference, the largest relative or absolute one at
most that), `(NaN)` (a NaN or infinity where the expected value is finite, or the reverse),
`(shape)` (an array of another shape), `(atol)` (a pass that rests on atol at values below it,
which the harness fails), `(no error)` (the case expects an error the backend does not
raise) or an error class, `(NonFiniteError)`. That is the executable ledger: `audit` gives, for one
backend's results, the failures no row lists for that backend, the listed cases that no longer
fail (a divergence that has stopped showing, or a listed id the suite does not have), and the
listed failures that do not fail the way the row says (a crash where a difference is listed, a
difference larger than the stated bound, a list that states nothing). `explain` names the rows of a
failure for the reports: the rows that list the case for that backend, else (an outside backend)
every row that names the case.
"""

from __future__ import annotations

import fnmatch
import math
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
_FAILS = re.compile(r"\*\*([a-z][a-z0-9._-]*) fails\*\*(?:\s*\(([^()]*)\))?((?:[\s,]*`[^`\s]+`)+)")
_BOUND = re.compile(r"^(rel|abs)\s*(?:≤|<=)\s*([0-9.]+(?:e[-+]?[0-9]+)?)$")
_NAMED = re.compile(r"^(NaN|shape|atol|no error|[A-Z][A-Za-z0-9]*Error)$")
_RAISED = re.compile(r"^(?:raised )?([A-Z][A-Za-z0-9]*Error): ")
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class LedgerRow:
    id: str
    kind: str | None  # the kind of the section the row is in
    cases: tuple[str, ...]  # case-id globs the row names
    fails: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (native backend, how they fail, case globs)

    def failing(self, backend: str) -> tuple[str, ...]:
        """The case globs this row says `backend` fails."""
        return tuple(dict.fromkeys(g for b, _, globs in self.fails if b == backend for g in globs))

    def stated(self, backend: str, case_id: str) -> list[str]:
        """How this row says `backend` fails `case_id` (one entry per list naming it; "" if unstated)."""
        return [how for b, how, globs in self.fails if b == backend and _match(case_id, globs)]


class Audit(NamedTuple):
    unexplained: list[str]  # failed case ids no row lists for the backend
    stale: list[str]  # "ROW: case status": listed cases that do not fail (passed, unsupported, absent)
    misstated: list[str]  # "ROW: case ...": listed failures that do not fail the way the row says


def failure_of(result: Any) -> str:
    """How a failed result (`message`, `max_abs_err`) failed, in the ledger's words: "difference",
    "NaN", "shape", "atol", "no error", an error class name, "crash", or "other" (a missing entry, a
    wrong type). The messages are the harness's own (runner.py, compare.py)."""
    message = result.message
    if "crashed on case" in message:
        return "crash"
    if message.startswith("expected ") and message.endswith("but the backend returned normally"):
        return "no error"
    raised = _RAISED.match(message)
    if raised:
        return raised.group(1)
    if "does not match the expected" in message:
        return "shape"
    if "passes only by atol" in message:  # runner.py: a pass resting on atol at values below it
        return "atol"
    if "(|diff| " in message:
        finite = result.max_abs_err is not None and math.isfinite(result.max_abs_err)
        return "difference" if finite else "NaN"  # compare counts a NaN or inf mismatch as an infinite diff
    return "other"


def holds(how: str, result: Any) -> str:
    """"" when `result` fails the way `how` states, else what is wrong with the statement."""
    if not how:
        return "the row states no kind of failure: write (rel ≤ B), (abs ≤ B), (NaN), (shape), (atol), (no error) or an error class"
    got = failure_of(result)
    bound = _BOUND.match(how)
    if bound:
        size = result.max_rel_err if bound.group(1) == "rel" else result.max_abs_err
        size = math.inf if size is None else size  # JSON results carry an infinite error as null
        if got != "difference":
            return f"fails by {got}, the row says {how}"
        if not size <= float(bound.group(2)):
            return f"{bound.group(1)} difference {size:.3g} is above the row's {how}"
        return ""
    if not _NAMED.match(how):
        return f"the row's ({how}) is no kind of failure: write (rel ≤ B), (abs ≤ B), (NaN), (shape), (atol), (no error) or an error class"
    return "" if got == how else f"fails by {got}, the row says {how}"


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


def _fails(text: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    out: list[tuple[str, str, tuple[str, ...]]] = []
    for backend, how, words in _FAILS.findall(text):
        globs = [g for word in _TICKED.findall(words) for g in _expand(word)]
        out.append((backend, how.strip(), tuple(dict.fromkeys(globs))))
    return tuple(out)


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
    that matches a passed case, or a glob that matches no failure at all; and every listed failure
    that does not fail the way a row listing it says (`holds`)."""
    results = [r for r in results if r.backend == backend]
    status = {r.case: r.status for r in results}
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
    misstated = [f"{row.id}: {r.case} {wrong}" for r in results if r.status == "failed" for row in rows
                 for how in row.stated(backend, r.case) if (wrong := holds(how, r))]
    return Audit(unexplained, stale, misstated)


def unexpected(results: Iterable[Any], rows: list[LedgerRow]) -> tuple[list[str], int]:
    """(one line per failure the ledger does not expect, how many failures it expects): a failure is
    expected when a row lists its case for its backend and it fails the way that row states. For CI
    gates on a native backend (`twinstep conform --ledger`); the twins' failures are never listed."""
    results = list(results)
    lines: list[str] = []
    failed = [r for r in results if r.status == "failed"]
    for backend in dict.fromkeys(r.backend for r in failed):
        found = audit(results, rows, backend)
        lines += [f"{case}[{backend}]: failed, and no ledger row lists it" for case in found.unexplained]
        lines += [f"{entry.split(': ', 1)[1].split(' ', 1)[0]}[{backend}]: {entry}" for entry in found.misstated]
    return lines, len(failed) - len(lines)

