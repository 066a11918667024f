"""`twinstep conform --jobs N`: cases run in worker processes, results merged in the serial order.

The (case × backend) pairs are cut into units: each backend's cases in up to N contiguous chunks
(neighbouring ids share compiled programs), one fresh `spawn` process per unit (torch and JAX are
not safe to fork once started), at most N at a time. A worker loads its case files itself and
sends each Result back as it finishes, so the results are those of `--jobs 1`, placed in the same
order. A worker that dies (a segfault, an abort, the OOM killer) costs one failed row naming the
case it was running; a new worker goes on with the rest of its unit. The workers share a temporary
directory for compiled programs (`backend.share_compiled`): two JAX workers would otherwise compile
most small programs twice.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from conformance.harness.backends import Backend
from conformance.harness.case import Case, collect_cases
from conformance.harness.runner import Releases, Result, run_case, run_cases, runs_on

MIN_CHUNK = 16  # cases: a smaller unit spends more on starting its process than it saves
MIN_PAIRS = 48  # (case, backend) pairs: a smaller run stays in this process


@dataclass
class _Unit:
    backend: Backend
    slots: list[int]  # where each result goes in the serial order
    cases: list[Case]
    done: int = 0  # results received
    process: Any = field(default=None, repr=False)


def run_parallel(cases: Sequence[Case], backends: Sequence[Backend], jobs: int) -> list[Result]:
    """run_cases(cases, backends) with up to `jobs` worker processes: the same results, same order."""
    pairs = [(c, b) for c in cases for b in backends if runs_on(c, b)]
    units = _units(pairs, backends, jobs) if jobs > 1 and len(pairs) >= MIN_PAIRS else []
    if len(units) < 2:
        return run_cases(cases, backends)
    results: list[Result | None] = [None] * len(pairs)
    ctx = mp.get_context("spawn")
    pending = list(reversed(units))  # popped from the end: the first unit starts first
    running: dict[Connection, _Unit] = {}
    compiled = tempfile.TemporaryDirectory(prefix="twinstep-compiled-")
    try:
        while pending or running:
            while pending and len(running) < jobs:
                unit = pending.pop()
                running[_start(ctx, unit, compiled.name)] = unit
            for conn in wait(list(running)):
                unit = running[conn]
                try:
                    results[unit.slots[unit.done]] = conn.recv()
                    unit.done += 1
                    if unit.done < len(unit.cases):
                        continue
                except EOFError:  # the worker died while running unit.cases[unit.done]
                    unit.process.join()
                    if unit.done < len(unit.cases):
                        k = unit.done
                        results[unit.slots[k]] = _crashed(unit.cases[k], unit.backend, unit.process.exitcode)
                        if k + 1 < len(unit.cases):
                            pending.append(_Unit(unit.backend, unit.slots[k + 1:], unit.cases[k + 1:]))
                del running[conn]
                conn.close()
                unit.process.join()
    finally:  # an interrupted run leaves no workers behind
        for unit in running.values():
            unit.process.kill()
            unit.process.join()
        compiled.cleanup()
    return [r for r in results if r is not None]


def _units(pairs: list[tuple[Case, Backend]], backends: Sequence[Backend], jobs: int) -> list[_Unit]:
    units: list[_Unit] = []
    for backend in backends:
        mine = [(i, c) for i, (c, b) in enumerate(pairs) if b is backend]
        n = max(1, min(jobs, len(mine) // MIN_CHUNK))
        size = -(-len(mine) // n)
        for lo in range(0, len(mine), size):
            part = mine[lo:lo + size]
            units.append(_Unit(backend, [i for i, _ in part], [c for _, c in part]))
    return units


def _start(ctx: Any, unit: _Unit, compiled: str) -> Connection:
    here, there = ctx.Pipe(duplex=False)
    b = unit.backend
    unit.process = ctx.Process(target=_serve, args=(there, (b.name, b.package, b.origin),
                                                     [str(c.path) for c in unit.cases[unit.done:]], compiled),
                               daemon=True)
    unit.process.start()
    there.close()
    unit.slots, unit.cases, unit.done = unit.slots[unit.done:], unit.cases[unit.done:], 0
    return here


def _serve(conn: Connection, backend: tuple[str, str, str], paths: list[str], compiled: str) -> None:
    """The worker: load the unit's case files, run each and send its Result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    b = Backend(*backend)
    b.share_compiled(compiled)
    cases, _ = collect_cases(paths)
    order = {str(c.path): c for c in cases}
    releases = Releases([b])
    for path in paths:
        conn.send(run_case(order[path], b))
        releases.case_done()
    conn.close()


def _crashed(case: Case, backend: Backend, exitcode: int | None) -> Result:
    how = (f"signal {signal.Signals(-exitcode).name}" if exitcode is not None and exitcode < 0
           else f"exit code {exitcode}")
    return Result(case.id, backend.name, False, None, None,
                  f"backend {backend.name} crashed on case {case.id}: its worker process died ({how})",
                  "failed", case.kind, str(case.path))
