"""`twinstep conform --jobs N` and releasing compiled programs between cases
(item 2): the fast paths give the straightforward path's report, row for row and bit for bit; a
worker that dies is one failed row naming the case it was running, and the run goes on; JAX
workers load the programs another worker compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.harness import runner, workers
from conformance.harness.backends import Backend
from conformance.harness.case import load_cases
from conformance.harness.workers import run_parallel

HUBER = {c.id for c in load_cases(only=["loss/*"]) if c.sections["loss"].name == "huber"}
ABORTS_ON_HUBER = ("import os\n"
                   "from ref_torch.losses import loss_value_and_grad as _real\n"
                   "def loss_value_and_grad(spec, *args, **kwargs):\n"
                   "    if spec.name == 'huber':\n"
                   "        os.abort()  # a crash no Python handler sees: the process is gone\n"
                   "    return _real(spec, *args, **kwargs)\n")


def report(tmp_path: Path, name: str, *args: str) -> tuple[int, list[dict]]:
    out = tmp_path / f"{name}.json"
    rc = main(["conform", *args, "--json", str(out)])
    return rc, json.loads(out.read_text())["results"]


def test_jobs_2_reports_what_jobs_1_reports_in_the_same_order(tmp_path: Path) -> None:
    args = ("--backend", "torch", "--backend", "oracle", "--only", "schedule/*", "--only", "clip/*")
    rc1, one = report(tmp_path, "one", *args, "--jobs", "1")
    rc2, two = report(tmp_path, "two", *args, "--jobs", "2")
    assert rc1 == rc2 == 0
    assert len(one) > 2 * 16 * 2  # enough rows for two units per backend
    assert two == one


def test_results_land_in_their_own_slots_whatever_the_unit_order() -> None:
    # eight units, four workers at a time, finishing in whatever order the machine makes: the rows
    # must still come back in the serial order (the first test alone would pass a merge in unit order)
    cases = load_cases(only=["schedule/*"])
    backends = [Backend("oracle"), Backend("torch")]
    serial = runner.run_cases(cases, backends)
    parallel = run_parallel(cases, backends, jobs=4)
    assert [(r.case, r.backend) for r in parallel] == [(r.case, r.backend) for r in serial]
    assert [r.to_json() for r in parallel] == [r.to_json() for r in serial]


def test_a_dying_worker_is_one_failed_row_per_case_it_died_on(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "acme_abort"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "losses.py").write_text(ABORTS_ON_HUBER)
    (pkg / "backend.py").write_text("from ref_torch.backend import context  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        rc, rows = report(tmp_path, "abort", "--backend", "acme_abort", "--only", "loss/*", "--jobs", "2")
    finally:
        for name in [m for m in sys.modules if m.startswith("acme_abort")]:
            del sys.modules[name]
    assert rc == 1 and len(HUBER) >= 2
    failed = {r["case"]: r["message"] for r in rows if r["status"] == "failed"}
    assert set(failed) == HUBER
    for case, message in failed.items():
        assert message == (f"backend acme_abort crashed on case {case}: its worker process died "
                           f"(signal SIGABRT)")
    assert len(rows) == len(load_cases(only=["loss/*"]))  # every other case ran and passed
    assert all(r["status"] == "passed" for r in rows if r["case"] not in HUBER)


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_jobs_must_be_a_whole_number_of_processes(value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["conform", "--jobs", value])
    assert exc.value.code == 2
    assert f"expected a whole number of processes >= 1, received {value!r}" in capsys.readouterr().err


def test_releasing_jax_programs_after_every_case_changes_no_result(monkeypatch) -> None:
    cases = load_cases(only=["clip/*"])[:8] + load_cases(only=["loss/seed-*"])
    jax = [Backend("jax")]
    kept = [r.to_json() for r in runner.run_cases(cases, jax)]
    released = []
    monkeypatch.setattr(Backend, "release", lambda self: released.append(self.name) or _release(self))
    monkeypatch.setattr(runner, "RELEASE_ABOVE_MIB", 0)  # release after every case
    monkeypatch.setattr(runner, "RELEASE_GROWTH_MIB", -1e9)
    again = [r.to_json() for r in runner.run_cases(cases, jax)]
    assert len(released) == len(cases)  # the negative control: the release really ran each time
    assert again == kept


def test_jax_workers_sharing_compiled_programs_report_what_one_process_reports(monkeypatch) -> None:
    cases = load_cases(only=["clip/*"])[:6] + load_cases(only=["loss/seed-*"])[:6]
    jax = [Backend("jax")]
    serial = [r.to_json() for r in runner.run_cases(cases, jax)]
    shared: list[str] = []

    class Spied(tempfile.TemporaryDirectory):
        def cleanup(self) -> None:
            shared.extend(os.listdir(self.name))
            super().cleanup()

    monkeypatch.setattr(workers.tempfile, "TemporaryDirectory", Spied)
    monkeypatch.setattr(workers, "MIN_PAIRS", 2)
    monkeypatch.setattr(workers, "MIN_CHUNK", 3)
    parallel = [r.to_json() for r in run_parallel(cases, jax, jobs=2)]
    assert parallel == serial
    assert any(name.endswith("-cache") for name in shared)  # the workers did keep their programs there


SHARED_EXP = ("import sys\n"
              "import jax.numpy as jnp\n"
              "from jax import monitoring\n"
              "from ref_jax.backend import share_compiled\n"
              "hits = []\n"
              "monitoring.register_event_listener(lambda name, **_: hits.append(name))\n"
              "share_compiled(sys.argv[1])\n"
              "x = jnp.exp(jnp.linspace(0.0, 1.0, 7))\n"
              "print(hits.count('/jax/compilation_cache/cache_hits'), x.tolist())\n")


def _shared_exp(directory: Path, **env: str) -> tuple[int, str]:
    run = subprocess.run([sys.executable, "-c", SHARED_EXP, str(directory)], capture_output=True, text=True,
                         check=True, env={**os.environ, **env})
    hits, values = run.stdout.split(" ", 1)
    return int(hits), values


def test_a_second_jax_process_loads_what_the_first_compiled(tmp_path: Path) -> None:
    first, second = _shared_exp(tmp_path), _shared_exp(tmp_path)
    assert first[0] == 0 and second[0] >= 1  # the first compiled, the second loaded
    assert second[1] == first[1]
    # a cache the user configured is kept: nothing lands in the run's directory
    mine = tmp_path / "user"
    theirs = _shared_exp(tmp_path / "run", JAX_COMPILATION_CACHE_DIR=str(mine),
                         JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    assert theirs[0] == 0 and any(mine.iterdir()) and not (tmp_path / "run").exists()


def _release(backend: Backend) -> None:
    from ref_jax.backend import release

    release()


def _counting_releases(monkeypatch: pytest.MonkeyPatch, resident: list[float | None]) -> tuple[runner.Releases, list]:
    readings = iter(resident)
    monkeypatch.setattr(runner.heap, "resident_mib", lambda: next(readings))
    released: list[str] = []
    monkeypatch.setattr(Backend, "release", lambda self: released.append(self.name))
    return runner.Releases([Backend("oracle"), Backend("torch")]), released


def test_releases_follow_the_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the budget nothing is released; over it every backend of the process releases once,
    and not again until the process has grown RELEASE_GROWTH_MIB past what the release left."""
    above, growth = runner.RELEASE_ABOVE_MIB, runner.RELEASE_GROWTH_MIB
    # after each case: one reading, plus one after each release
    kept = above - 100.0  # what a release leaves (e.g. the framework itself)
    readings = [above - 1, above + 1, kept, above + 1, kept + growth + 1, kept]
    releases, released = _counting_releases(monkeypatch, readings)
    for _ in range(4):
        releases.case_done()
    assert released == ["oracle", "torch", "oracle", "torch"]


def test_releases_count_cases_where_memory_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    n = runner.RELEASE_EVERY
    releases, released = _counting_releases(monkeypatch, [None] * (2 * n + 2))
    for _ in range(2 * n - 1):
        releases.case_done()
    assert released == ["oracle", "torch"]  # after case n only (negative control: not after every case)
