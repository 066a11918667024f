"""`twinstep conform`: run conformance cases on the backends and report case × backend results."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from conformance.harness.backends import PACKAGES, get_backends
from conformance.harness.case import load_cases
from conformance.harness.runner import Result, run_cases, summarize


def add_parser(sub: Any) -> None:
    p = sub.add_parser("conform", help="run the conformance suite (or any directory of case files)",
                       description="Run conformance cases on each backend and compare with the expected "
                                   "values. Exits 0 only if every case passed on every backend.")
    p.add_argument("--backend", choices=[*PACKAGES, "all"], default="all",
                   help="which backend to run (default: all three)")
    p.add_argument("--cases", nargs="+", action="extend", metavar="DIR",
                   help="case files or directories (default: the bundled suite)")
    p.add_argument("--only", action="append", metavar="GLOB",
                   help="only case ids matching this glob, e.g. 'loss/*' (repeatable)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (docs/contract.md §3)")
    p.add_argument("--failures", action="store_true", help="print only the failed rows")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cases = load_cases(args.cases, args.only)
    if not cases:
        print("twinstep: no cases matched", file=sys.stderr)
        return 1
    results = run_cases(cases, get_backends(args.backend))
    print_table(results, sys.stdout, failures_only=args.failures)
    summary = summarize(results)
    if args.json:
        write_json(Path(args.json), results, summary)
    return 0 if summary["failed"] == 0 and summary["passed"] > 0 else 1


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def print_table(results: list[Result], out: TextIO, failures_only: bool = False) -> None:
    width = max([len(r.case) for r in results] + [4])
    out.write(f"{'case':<{width}}  {'backend':<7}  {'result':<6}  {'max_abs':>8}  {'max_rel':>8}  message\n")
    for r in results:
        if failures_only and r.passed:
            continue
        status = "pass" if r.passed else "FAIL"
        out.write(f"{r.case:<{width}}  {r.backend:<7}  {status:<6}  {_fmt(r.max_abs_err):>8}  "
                  f"{_fmt(r.max_rel_err):>8}  {r.message}\n")
    per: dict[str, list[int]] = {}
    for r in results:
        per.setdefault(r.backend, [0, 0])[0 if r.passed else 1] += 1
    parts = [f"{b}: {p} passed, {f} failed" for b, (p, f) in per.items()]
    total = summarize(results)
    out.write(f"\n{len({r.case for r in results})} cases; {'; '.join(parts)}; "
              f"total {total['passed']} passed, {total['failed']} failed\n")


def write_json(path: Path, results: list[Result], summary: dict[str, int]) -> None:
    """Write the report atomically, so a reader never sees a half-written file."""
    payload = {"results": [r.to_json() for r in results], "summary": summary}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1, allow_nan=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
