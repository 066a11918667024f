"""The runs of `twinstep drift`, trained in a few long-lived worker processes (conformance/cli/drift.py).

Each worker trains a chain of runs of one framework one after another, each exactly as `twinstep
train` would (the same command, in the worker's process), so a chain pays for starting Python, importing
its framework and (JAX) compiling the step once instead of once per run: the JAX workers keep their
compiled programs in one directory, so a self-run loads the step its twin compiled; each worker's torch
runs on its share of the cores (`worker_threads`), so that two workers do not fight over them. A twin's float64
run follows it in its chain, since it skips the updates that twin skipped. Each run's output goes to
RUNS/NAME.log; a run that fails stops the others and is one TwinstepError naming it and its log.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import tempfile
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import NamedTuple

from conformance.errors import TwinstepError


class Planned(NamedTuple):
    """One run: its name (its directory under RUNS), framework and --set overrides. `exact_of` names
    the twin whose float64 run this is: that twin's skipped updates join the overrides once it has run."""

    name: str
    backend: str
    sets: list[str]
    exact_of: str | None = None


def chains(plan: Sequence[Planned], jobs: int) -> list[list[Planned]]:
    """The runs cut into chains for `jobs` workers: one framework per chain, its twin (the run named
    after the framework) first with its float64 run after it, the framework's other runs dealt over
    its other chains; the JAX chains (slower) first. One job: one chain of everything."""
    if jobs <= 1:
        return [sorted(plan, key=lambda p: p.exact_of is not None)]  # each float64 run after its twin
    out = []
    for backend in sorted({p.backend for p in plan}, key=lambda b: b != "jax"):
        first = [p for p in plan if p.name == backend] + [p for p in plan if p.exact_of == backend]
        rest = [p for p in plan if p.backend == backend and p not in first]
        more = max(0, min(jobs // 2, len(rest) + 1) - 1)  # chains besides the twin's
        out.append(first if more else first + rest)
        out += [rest[i::more] for i in range(more)]
    return out


def worker_threads(cores: int, workers: int) -> int:
    """Each worker's share of the cores for torch's intra-op pool (at least 1)."""
    return max(1, cores // max(1, workers))


def train_all(config: str, plan: Sequence[Planned], runs: Path, jobs: int, cores: int) -> dict[str, list[str]]:
    """Train every planned run under `runs`, one `spawn` worker process per chain (at most `jobs`);
    returns each run's overrides as trained (a float64 run's include its twin's skipped updates). The
    first failure kills the other workers (SIGKILL: a trainer answers SIGTERM by saving first); the
    workers share `cores` CPUs."""
    runs.mkdir(exist_ok=True)
    ctx = mp.get_context("spawn")
    done: dict[str, list[str]] = {}
    workers: dict[Connection, tuple[BaseProcess, list[Planned]]] = {}
    cut = chains(plan, jobs)
    threads = worker_threads(cores, len(cut))
    with tempfile.TemporaryDirectory(prefix="twinstep-drift-") as compiled:
        try:
            for chain in cut:
                here, there = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_serve, args=(there, config, chain, str(runs), compiled, threads), daemon=True)
                proc.start()
                there.close()
                workers[here] = (proc, chain)
            waiting = dict(workers)
            while waiting:
                for conn in wait(list(waiting)):
                    proc, chain = waiting.pop(conn)
                    try:
                        ok, value = conn.recv()
                    except EOFError:
                        proc.join()
                        raise TwinstepError(f"the drift worker training {', '.join(p.name for p in chain)} died "
                                            f"(exit {proc.exitcode}); the logs are in {runs}") from None
                    if not ok:
                        raise TwinstepError(value)
                    done.update(value)
        finally:
            for proc, _ in workers.values():
                if proc.is_alive():
                    proc.kill()
                proc.join()
    return done


def _serve(conn: Connection, config: str, chain: list[Planned], runs: str, compiled: str, threads: int) -> None:
    """A worker: train the chain and send back (True, overrides per run) or (False, the error line)."""
    try:
        conn.send((True, train_chain(config, chain, runs, compiled, threads)))
    except TwinstepError as exc:
        conn.send((False, str(exc)))
    finally:
        conn.close()


def train_chain(config: str, chain: Sequence[Planned], runs: str, compiled: str, threads: int) -> dict[str, list[str]]:
    """Train `chain` in this process, one run after another (a worker of `train_all`), torch on
    `threads` threads."""
    from conformance.cli import main
    from conformance.run.drift import exact_overrides, skipped_updates

    # torch's intra-op pool sized to this worker's share of the cores (a user's OMP_NUM_THREADS wins): with
    # each worker's pool as large as the machine, the busy-waiting threads of two workers take turns on the
    # same cores and a torch run took 7 × its time alone
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # a cache the user configured is used as it is
        os.environ.update(JAX_COMPILATION_CACHE_DIR=compiled, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                          JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    trained = {}
    for p in chain:
        sets = p.sets
        if p.exact_of is not None:
            from conformance.config import load_config

            twin = load_config(config, p.sets)  # the low-precision side's scaling, as its twin ran
            sets = [*p.sets, *exact_overrides(twin, skipped_updates(Path(runs) / p.exact_of))]
        log = Path(runs) / f"{p.name}.log"
        argv = ["train", config, "--backend", p.backend, "--out", str(Path(runs) / p.name),
                *[a for s in sets for a in ("--set", s)]]
        with open(log, "w") as stream, contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            rc = main(argv)
        if rc != 0:
            lines = log.read_text(errors="replace").strip().splitlines()
            last = lines[-1].removeprefix("twinstep: error: ") if lines else "no output"
            raise TwinstepError(f"drift run {p.name} failed (exit {rc}): {last} "
                                f"(log: {log})")
        trained[p.name] = sets
    return trained
