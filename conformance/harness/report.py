"""Reports of a conformance run: the terminal tables, JSON (docs/contract.md §3), JUnit XML and a
Markdown case × backend matrix. Every file is written atomically (a reader never sees half of it).

- terminal: the rows to show (by default the failed ones; all with --verbose), then a summary
  table kind × backend of passed / failed / unsupported, then one total line;
- JSON: {"results": [Result.to_json()], "summary": {"passed", "failed", "unsupported"}};
- JUnit: one <testsuite> per backend, one <testcase> per case × backend (classname = the kind,
  name = "<case id>[<backend>]"), <failure> with the message, <skipped> for unsupported;
- Markdown: the summary, then one row per case with each backend's status and worst absolute
  error, and for failures of a backend that is not a built-in the ledger rows that name the case
  (conformance.harness.ledger), then the failure messages.
"""

from __future__ import annotations

import json
import os
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from conformance.harness.backends import ALL, NATIVES
from conformance.harness.ledger import LedgerRow, explain
from conformance.harness.runner import NO_BACKEND, STATUSES, Result, summarize

SHORT = {"passed": "pass", "failed": "FAIL", "unsupported": "unsup"}


def write_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _backends(results: Sequence[Result]) -> list[str]:
    return list(dict.fromkeys(r.backend for r in results if r.backend != NO_BACKEND))


def print_rows(results: Sequence[Result], out: TextIO) -> None:
    """The per-case table: case, backend, result, worst errors, message."""
    if not results:
        return
    width = max([len(r.case) for r in results] + [4])
    bw = max([len(r.backend) for r in results] + [7])
    out.write(f"{'case':<{width}}  {'backend':<{bw}}  {'result':<6}  {'max_abs':>8}  {'max_rel':>8}  message\n")
    for r in results:
        note = r.message or ("; ".join(f"atol carried {c}" for c in r.atol_carried) if r.atol_carried else "")
        out.write(f"{r.case:<{width}}  {r.backend:<{bw}}  {SHORT[r.status]:<6}  {_fmt(r.max_abs_err):>8}  "
                  f"{_fmt(r.max_rel_err):>8}  {note}\n")


def summary_table(results: Sequence[Result]) -> list[list[str]]:
    """Rows [kind, cell per backend] with cells "passed/failed/unsupported", and a total row."""
    backends = _backends(results)
    kinds = sorted({r.kind for r in results if r.backend != NO_BACKEND})
    rows = []
    for kind in [*kinds, "total"]:
        cells = []
        for b in backends:
            s = summarize([r for r in results if r.backend == b and kind in ("total", r.kind)])
            cells.append("/".join(str(s[k]) for k in STATUSES) if any(s.values()) else "-")
        rows.append([kind, *cells])
    return [["kind", *backends], *rows]


def print_summary(results: Sequence[Result], out: TextIO, table: bool = True) -> None:
    if table and _backends(results):
        rows = summary_table(results)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        out.write("\npassed/failed/unsupported\n")
        for row in rows:
            out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")
    broken = [r for r in results if r.backend == NO_BACKEND]
    if broken:
        out.write(f"\n{len(broken)} case file(s) could not be loaded\n")
    parts = []
    for b in _backends(results):
        s = summarize([r for r in results if r.backend == b])
        parts.append(f"{b}: {s['passed']} passed, {s['failed']} failed"
                     + (f", {s['unsupported']} unsupported" if s["unsupported"] else ""))
    total = summarize(results)
    more = f", {total['unsupported']} unsupported" if total["unsupported"] else ""
    cases = len({r.case for r in results if r.backend != NO_BACKEND})
    out.write(f"\n{cases} cases; {'; '.join(parts) or 'no backend ran'}; "
              f"total {total['passed']} passed, {total['failed']} failed{more}\n")


def json_report(results: Sequence[Result]) -> str:
    payload = {"results": [r.to_json() for r in results], "summary": summarize(results)}
    return json.dumps(payload, indent=1, allow_nan=True) + "\n"


def junit_xml(results: Sequence[Result]) -> str:
    """JUnit XML: one <testsuite> per backend (case files that did not load: "case-files")."""
    root = ET.Element("testsuites", name="twinstep conform")
    for backend in [*_backends(results), NO_BACKEND]:
        mine = [r for r in results if r.backend == backend]
        if not mine:
            continue
        s = summarize(mine)
        suite = ET.SubElement(root, "testsuite", name="case-files" if backend == NO_BACKEND else backend,
                              tests=str(len(mine)), failures=str(s["failed"]), errors="0",
                              skipped=str(s["unsupported"]))
        for r in mine:
            name = r.case if backend == NO_BACKEND else f"{r.case}[{backend}]"
            case = ET.SubElement(suite, "testcase", classname=r.kind or "case-file", name=name, file=r.file)
            if r.status == "failed":
                ET.SubElement(case, "failure", message=r.message).text = r.message
            elif r.status == "unsupported":
                ET.SubElement(case, "skipped", message=r.message)
    total = summarize(results)
    root.set("tests", str(len(results)))
    root.set("failures", str(total["failed"]))
    root.set("errors", "0")
    root.set("skipped", str(total["unsupported"]))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _cell(r: Result | None) -> str:
    if r is None:
        return "·"
    if r.status == "passed":
        return f"pass {_fmt(r.max_abs_err)}" if r.max_abs_err is not None else "pass"
    if r.status == "unsupported":
        return "unsupported"
    return f"**FAIL** {_fmt(r.max_abs_err)}" if r.max_abs_err is not None else "**FAIL**"


def ledger_cell(results: Sequence[Result], ledger: list[LedgerRow]) -> str:
    """The ledger rows that explain the failures of non-built-in backends in one case's results."""
    parts = []
    for r in results:
        if r.status == "failed" and r.backend not in ALL and r.backend != NO_BACKEND:
            rows = explain(ledger, r.case, r.backend if r.backend in NATIVES else None)
            parts.append(f"{r.backend}: {', '.join(rows) if rows else 'no row'}")
    return "; ".join(parts) or "-"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_report(results: Sequence[Result], ledger: list[LedgerRow],
                    versions: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The Markdown matrix; `versions`: per backend, what its `backend.describe()` reports (the
    string values are shown: package versions)."""
    backends = _backends(results)
    total = summarize(results)
    lines = ["# twinstep conformance report", "",
             f"{total['passed']} passed, {total['failed']} failed, {total['unsupported']} unsupported "
             f"({len(results)} results, backends: {', '.join(backends) or 'none'}).", ""]
    for name, info in (versions or {}).items():
        shown = ", ".join(f"{k} {v}" for k, v in info.items() if isinstance(v, str) and k != "backend")
        lines += [f"{name}: {shown}.", ""] if shown else []
    lines += ["## Summary (passed/failed/unsupported)", ""]
    rows = summary_table(results)
    lines += ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    by_case: dict[str, dict[str, Result]] = {}
    for r in results:
        if r.backend != NO_BACKEND:
            by_case.setdefault(r.case, {})[r.backend] = r
    lines += ["", "## Cases (worst absolute error)", "",
              "| case | " + " | ".join(backends) + " | ledger |", "|" + " --- |" * (len(backends) + 2)]
    for case in sorted(by_case):
        got = by_case[case]
        lines.append(f"| `{case}` | " + " | ".join(_cell(got.get(b)) for b in backends)
                     + f" | {ledger_cell(list(got.values()), ledger)} |")
    bad = [r for r in results if r.status == "failed"]
    if bad:
        lines += ["", "## Failures", ""]
        lines += [f"- `{r.case}` [{r.backend}]: {_md(r.message)}" for r in bad]
    carried = [r for r in results if r.status == "passed" and r.atol_carried]
    if carried:
        lines += ["", "## Passes that rest on atol below the value (the case's [tolerance] why says why)", ""]
        lines += [f"- `{r.case}` [{r.backend}]: {_md('; '.join(r.atol_carried))}" for r in carried]
    declined = [r for r in results if r.status == "unsupported"]
    if declined:
        lines += ["", "## Unsupported", ""]
        lines += [f"- `{r.case}` [{r.backend}]: {_md(r.message.removeprefix('unsupported: '))}" for r in declined]
    return "\n".join(lines) + "\n"
