"""The cases as a pytest suite: `pytest --pyargs conformance.suite
--twinstep-backend NAME` runs each case × backend as one test, in a fresh interpreter started
outside this repository, with the plugin found through its pytest11 entry point or `-p`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.processes import PROCESS_S, run_process

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "conformance" / "cases"


def pytest_run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    env.pop("PYTEST_ADDOPTS", None)
    return run_process([sys.executable, "-m", "pytest", "--pyargs", "conformance.suite", "-p", "no:cacheprovider",
                        "-rA", "-v", *args], "finish the pytest run", PROCESS_S, cwd=cwd, env=env, capture_output=True,
                       text=True)


def test_the_plugin_found_by_its_entry_point_runs_each_case_as_a_test(tmp_path) -> None:
    dist = tmp_path / "twinstep_suite-0.1.dist-info"  # what an installed twinstep registers (pyproject.toml)
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: twinstep-suite\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nconformance.suite.plugin = conformance.suite.plugin\n")
    done = pytest_run(tmp_path, "--twinstep-backend", "oracle", "--twinstep-only", "loss/seed-*")
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"^PASSED \S*test_conformance\.py::(\S+)", done.stdout, re.M)
    assert passed == [f"test_case[loss/{n}[oracle]]" for n in ("seed-bce-with-logits", "seed-cross-entropy", "seed-mse")]


def test_failures_unsupported_cases_and_broken_files_are_tests_too(tmp_path) -> None:
    """Negative controls: a planted bug fails its test, a missing function skips, a broken file fails."""
    acme = tmp_path / "acme"
    for name, losses in (("twin", "from ref_torch.losses import loss_value_and_grad  # noqa: F401\n"),
                         ("buggy", "from ref_torch.losses import loss_value_and_grad as _real\n"
                                   "def loss_value_and_grad(*a, **k):\n"
                                   "    out = _real(*a, **k)\n"
                                   "    return {**out, 'value': out['value'] * 1.001}\n")):
        (acme / name).mkdir(parents=True)
        (acme / "__init__.py").touch()
        (acme / name / "__init__.py").touch()
        (acme / name / "losses.py").write_text(losses)
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "mse.toml").write_text((CASES / "loss" / "seed-mse.toml").read_text())
    (cases / "sgd.toml").write_text((CASES / "optimizer" / "seed-sgd-1d.toml").read_text())
    (cases / "broken.toml").write_text("id = \n")
    done = pytest_run(tmp_path, "-p", "conformance.suite.plugin", "--twinstep-backend", "acme.twin",
                      "--twinstep-backend", "acme.buggy", "--twinstep-cases", str(cases))
    assert done.returncode == 1, done.stdout + done.stderr
    got = dict(re.findall(r"::test_case\[(.+?\])\] (PASSED|FAILED|SKIPPED)", done.stdout))
    assert got == {"loss/seed-mse[acme.twin]": "PASSED", "loss/seed-mse[acme.buggy]": "FAILED",
                   "optimizer/seed-sgd-1d[acme.twin]": "SKIPPED", "optimizer/seed-sgd-1d[acme.buggy]": "SKIPPED",
                   f"{cases / 'broken.toml'}[case-file]": "FAILED"}, done.stdout
    assert "unsupported: optimizers.run_trajectory" in done.stdout
    assert "broken.toml: (file) invalid TOML" in done.stdout


def test_a_backend_that_cannot_be_imported_is_a_usage_error(tmp_path) -> None:
    done = pytest_run(tmp_path, "-p", "conformance.suite.plugin", "--twinstep-backend", "nosuch.pkg")
    assert done.returncode == 4  # pytest's usage error
    assert "ERROR: twinstep: backend nosuch.pkg cannot be imported: ModuleNotFoundError" in done.stderr
