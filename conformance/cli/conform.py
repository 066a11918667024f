"""`twinstep conform`: run conformance cases on backends and report case × backend results.

Backends: the built-ins (torch, jax, oracle; `all`, the default), a short name registered under
the entry-point group `twinstep.backends`, or the dotted name of any importable package with the
built-ins' module and function names (docs/backends.md). `--list-backends` lists the names.
Exit status: 0 when no result failed and at least one passed; 1 otherwise (a case file that could
not be loaded is a failed result, the other files still run); 2 for a usage error (a backend that
cannot be imported, a missing case directory). With `--ledger`, failures the divergence ledger lists
for their backend (failing as it states) do not count: a native backend's CI gate.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.harness.backends import BUILTINS, available_backends, get_backends
from conformance.harness.case import collect_cases
from conformance.harness.ledger import LEDGER_FILE, read_ledger, unexpected
from conformance.harness.report import (
    json_report,
    junit_xml,
    markdown_report,
    print_rows,
    print_summary,
    write_atomic,
)
from conformance.harness.runner import broken_results, summarize
from conformance.harness.workers import run_parallel


def add_parser(sub: Any) -> None:
    p = sub.add_parser("conform", help="run the conformance suite (or any directory of case files)",
                       description="Run conformance cases on each backend and compare with the expected "
                                   "values. Exits 0 only if no case failed and at least one passed.")
    p.add_argument("--backend", action="append", metavar="NAME",
                   help=f"a backend to run (repeatable): {', '.join(BUILTINS)}, all (default), a name from "
                        "--list-backends, or the dotted name of a package with the same modules (docs/backends.md)")
    p.add_argument("--list-backends", action="store_true", help="list the backend names and where they come from")
    p.add_argument("--cases", nargs="+", action="extend", metavar="DIR",
                   help="case files or directories (default: the bundled suite)")
    p.add_argument("--only", action="append", metavar="GLOB",
                   help="only case ids matching this glob, e.g. 'loss/*' (repeatable)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (docs/contract.md §3)")
    p.add_argument("--junit", metavar="PATH", help="also write JUnit XML (one testcase per case × backend)")
    p.add_argument("--report", metavar="PATH", help="also write a Markdown case × backend matrix")
    p.add_argument("--ledger", nargs="?", const="", default=None, metavar="PATH",
                   help="judge failures against the divergence ledger (default: docs/divergences.md): exit 0 "
                        "when every failure is one a row lists for its backend, failing as the row states, "
                        "1 on any other (a CI gate for a native backend); the report cites it too")
    p.add_argument("--jobs", type=whole_number("processes"), default=None, metavar="N",
                   help="worker processes (default: the CPUs this process may use; 1: every case in this "
                        "process, in order); results and their order are the same for every N")
    p.add_argument("-v", "--verbose", action="store_true", help="print every case × backend row")
    p.add_argument("--failures", action="store_true", help="print only the failed rows and the total line")
    p.set_defaults(run=run)


def whole_number(what: str) -> Callable[[str], int]:
    """An argparse type: a whole number of `what` >= 1, else the usage error naming what it received."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"expected a whole number of {what} >= 1, received {text!r}")
        return n

    return parse


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def list_backends() -> int:
    infos = available_backends()
    width = max(len(b.name) for b in infos)
    pw = max(len(b.package) for b in infos)
    for b in infos:
        print(f"{b.name:<{width}}  {b.package:<{pw}}  {b.origin}")
    print("any other NAME: the dotted name of an importable package with the same modules (docs/backends.md)")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.list_backends:
        return list_backends()
    backends = get_backends(args.backend or "all")  # BackendError (exit 2) before any case runs
    ledger = read_ledger(args.ledger or None)
    if args.ledger is not None and not ledger:
        print(f"twinstep: no divergence ledger rows in {args.ledger or LEDGER_FILE}", file=sys.stderr)
        return 2
    cases, broken = collect_cases(args.cases, args.only)
    if not cases and not broken:
        print("twinstep: no cases matched", file=sys.stderr)
        return 1
    jobs = args.jobs if args.jobs is not None else default_jobs()
    results = broken_results(broken) + run_parallel(cases, backends, jobs)
    shown = results if args.verbose else [r for r in results if r.status == "failed"]
    print_rows(shown, sys.stdout)
    print_summary(results, sys.stdout, table=not args.failures)
    if args.json:
        write_atomic(Path(args.json), json_report(results))
    if args.junit:
        write_atomic(Path(args.junit), junit_xml(results))
    if args.report:
        versions = {b.name: b.describe() for b in backends}
        write_atomic(Path(args.report), markdown_report(results, ledger, versions))
    summary = summarize(results)
    if args.ledger is not None:
        return _judged(results, ledger, args.ledger or str(LEDGER_FILE), summary["passed"] > 0)
    return 0 if summary["failed"] == 0 and summary["passed"] > 0 else 1


def _judged(results: list[Any], rows: list[Any], where: str, any_passed: bool) -> int:
    """The exit status of `--ledger`: 0 when every failure is one the ledger expects."""
    lines, expected = unexpected(results, rows)
    for line in lines:
        print(f"not in the ledger: {line}")
    print(f"ledger {where}: {expected} failure(s) listed there, {len(lines)} not")
    return 0 if not lines and any_passed else 1
