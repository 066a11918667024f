"""Outside backends: any importable package with the built-ins' module and function
names runs the cases by its dotted name, or by a short name its distribution registers under the
`twinstep.backends` entry points. Packages are written into tmp_path (outside this repository) and
put on sys.path; each check has its negative control (a planted bug fails, a missing function is
unsupported and not passed, a crash and an import failure are named)."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.harness.backends import available_backends, resolve_backend
from conformance.harness.case import load_cases

DOCS = Path(__file__).resolve().parents[1] / "docs" / "backends.md"
LOSS_CASES = load_cases(only=["loss/*"])

REEXPORT = {  # a twin that is ref_torch's modules under another name
    "losses.py": "from ref_torch.losses import *  # noqa: F403\nfrom ref_torch.losses import loss_value_and_grad  # noqa: F401\n",
    "backend.py": "from ref_torch.backend import context  # noqa: F401\n",
}
PLANTED = ("def loss_value_and_grad(*args, **kwargs):\n"
           "    out = _real(*args, **kwargs)\n"
           "    return {**out, 'value': out['value'] * 1.001}  # the planted bug: 0.1 % too large\n")


def package(root: Path, name: str, files: dict[str, str]) -> None:
    path = root.joinpath(*name.split("."))
    path.mkdir(parents=True, exist_ok=True)
    for parent in [root.joinpath(*name.split(".")[:i]) for i in range(1, name.count(".") + 1)]:
        (parent / "__init__.py").touch()
    (path / "__init__.py").write_text(files.get("__init__.py", ""))
    for file, text in files.items():
        (path / file).write_text(text)


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """tmp_path on sys.path; the packages written there are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("acme", "my_backend")]:
        del sys.modules[name]


def run_json(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    rc = main(["conform", *args, "--json", str(out)])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def test_a_package_reexporting_ref_torch_passes_the_loss_cases(outside) -> None:
    package(outside, "acme.twin", REEXPORT)
    rc, report = run_json(outside, "--backend", "acme.twin", "--only", "loss/*")
    assert rc == 0
    assert report["summary"] == {"passed": len(LOSS_CASES), "failed": 0, "unsupported": 0}
    assert {r["backend"] for r in report["results"]} == {"acme.twin"}


def test_negative_control_the_same_package_with_a_planted_bug_fails_them(outside) -> None:
    package(outside, "acme.buggy", {**REEXPORT, "losses.py": "from ref_torch.losses import loss_value_and_grad as _real\n"
                                    + PLANTED})
    rc, report = run_json(outside, "--backend", "acme.buggy", "--only", "loss/*")
    assert rc == 1
    failed = {r["case"] for r in report["results"] if r["status"] == "failed"}
    value_cases = {c.id for c in LOSS_CASES if not c.expects_error  # where 0.1 % exceeds the case's tolerance
                   and (1e-3 * abs(c.expected.value) > c.atol + c.rtol * abs(c.expected.value)).any()}
    assert failed == value_cases and len(failed) > 40
    assert all("value" in r["message"] for r in report["results"] if r["status"] == "failed")


def test_a_registered_short_name_is_listed_and_runs(outside, capsys) -> None:
    package(outside, "acme.twin", REEXPORT)
    dist = outside / "acme_backends-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-backends\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[twinstep.backends]\nacme = acme.twin\n")
    assert ("acme", "acme.twin", "entry point of acme-backends 1.0") in [
        (b.name, b.package, b.origin) for b in available_backends()]
    assert main(["conform", "--list-backends"]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"^acme\s+acme\.twin\s+entry point of acme-backends 1\.0$", listed, re.M)
    assert re.search(r"^torch\s+ref_torch\s+built-in$", listed, re.M)
    rc, report = run_json(outside, "--backend", "acme", "--only", "loss/seed-*")
    assert rc == 0 and report["summary"]["passed"] == 3 and {r["backend"] for r in report["results"]} == {"acme"}


def test_a_missing_function_is_unsupported_not_passed_and_not_a_crash(outside) -> None:
    package(outside, "acme.twin", REEXPORT)  # no optimizers module
    rc, report = run_json(outside, "--backend", "acme.twin", "--only", "loss/seed-mse", "--only", "optimizer/seed-sgd-1d")
    got = {r["case"]: (r["status"], r["passed"], r["message"]) for r in report["results"]}
    assert got["optimizer/seed-sgd-1d"] == ("unsupported", False, "unsupported: optimizers.run_trajectory")
    assert got["loss/seed-mse"][0] == "passed" and rc == 0
    rc, report = run_json(outside, "--backend", "acme.twin", "--only", "optimizer/seed-sgd-1d")
    assert rc == 1 and report["summary"] == {"passed": 0, "failed": 0, "unsupported": 1}  # nothing checked


def test_a_backend_may_decline_a_case_with_unsupported_error(outside) -> None:
    package(outside, "acme.picky", {"losses.py": "from conformance.errors import UnsupportedError\n"
                                                 "def loss_value_and_grad(spec, *a, **k):\n"
                                                 "    raise UnsupportedError(f'{spec.name} is not fused yet')\n"})
    rc, report = run_json(outside, "--backend", "acme.picky", "--only", "loss/seed-mse")
    assert report["results"][0]["status"] == "unsupported"
    assert report["results"][0]["message"] == "unsupported: mse is not fused yet"


def test_an_undocumented_exception_is_a_failure_naming_backend_case_and_exception(outside) -> None:
    package(outside, "acme.crashy", {"losses.py": "def loss_value_and_grad(*a, **k):\n    raise KeyError('bias')\n"})
    rc, report = run_json(outside, "--backend", "acme.crashy", "--only", "loss/seed-mse")
    assert rc == 1
    message = report["results"][0]["message"]
    assert report["results"][0]["status"] == "failed"
    assert message.startswith("backend acme.crashy crashed on case loss/seed-mse: KeyError: 'bias' at crashy/losses.py:2")


@pytest.mark.parametrize(("name", "line"), [
    ("acme.broken", "twinstep: error: backend acme.broken cannot be imported: ModuleNotFoundError: No module named "
                    "'acme_missing_dependency'"),
    ("nosuch.pkg", "twinstep: error: backend nosuch.pkg cannot be imported: ModuleNotFoundError: No module named 'nosuch'"),
    ("no such", "twinstep: error: backend 'no such' is neither a backend name (torch, jax, oracle, torch-native, "
                "optax-native, keras, all) nor the dotted name of a Python package"),
])
def test_a_backend_that_cannot_be_imported_is_one_line_and_exit_2(outside, capsys, name: str, line: str) -> None:
    package(outside, "acme.broken", {"__init__.py": "import acme_missing_dependency\n"})
    assert main(["conform", "--backend", name, "--only", "loss/seed-mse"]) == 2
    captured = capsys.readouterr()
    assert captured.err == line + "\n" and captured.out == ""


def test_a_builtin_name_wins_and_resolves_without_entry_points() -> None:
    assert resolve_backend("torch").package == "ref_torch" and resolve_backend("torch").builtin
    assert not resolve_backend("conformance.oracle").builtin  # the same package by its dotted name is outside


def _docs_example(root: Path) -> list[str]:
    """Write docs/backends.md's files into root; return the arguments of its `twinstep conform` line."""
    text = DOCS.read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            path = root / first[2:]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block)
    (command,) = [line for line in text.splitlines() if line.startswith("PYTHONPATH=. twinstep conform")]
    return shlex.split(command)[3:]  # after "PYTHONPATH=. twinstep conform"


def test_the_worked_example_of_docs_backends_runs_as_written(outside) -> None:
    args = _docs_example(outside)
    rc, report = run_json(outside, *args)
    assert rc == 0
    by_status = {s: sorted(r["case"] for r in report["results"] if r["status"] == s) for s in ("passed", "failed")}
    assert by_status["failed"] == []
    assert set(by_status["passed"]) >= {"optimizer/seed-adam-first-step", "optimizer/seed-adam-step-equals-lr",
                                        "optimizer/seed-adam-l2-coupled", "optimizer/torch-adam-open"}
    unsupported = {r["case"]: r["message"] for r in report["results"] if r["status"] == "unsupported"}
    assert unsupported["optimizer/torch-adam-steplr"] == "unsupported: update.run_updates"
    assert "MyAdam runs adam with lr, betas, eps and weight_decay only" in unsupported["optimizer/torch-adam-closed"]


def test_negative_control_the_worked_example_without_bias_correction_fails(outside) -> None:
    args = _docs_example(outside)
    source = outside / "my_backend" / "optimizers.py"
    text = source.read_text()
    assert 'value=-group["lr"] / (1 - beta1**t)' in text
    source.write_text(text.replace('value=-group["lr"] / (1 - beta1**t)', 'value=-group["lr"]'))
    rc, report = run_json(outside, *args)
    assert rc == 1
    failed = {r["case"] for r in report["results"] if r["status"] == "failed"}
    assert {"optimizer/seed-adam-first-step", "optimizer/torch-adam-open"} <= failed


OLD_PROTOCOL = {  # a backend written before `at`, `metrics` and `ema` joined the protocol
    "schedules.py": "from ref_torch import schedules as _s\n"
                    "def schedule_values(schedule, optimizer, steps, updates_per_epoch=1):\n"
                    "    return _s.schedule_values(schedule, optimizer, steps, updates_per_epoch)\n",
    "optimizers.py": "from ref_torch import optimizers as _o\n"
                     "def run_trajectory(spec, params, grads=None, objective=None, steps=None, dtype='float64', state=None):\n"
                     "    return _o.run_trajectory(spec, params, grads, objective, steps, dtype, state)\n",
    "backend.py": "from ref_torch.backend import context  # noqa: F401\n",
}


def test_a_backend_without_the_newer_arguments_is_unsupported_for_the_cases_that_need_them(outside) -> None:
    package(outside, "acme.old", OLD_PROTOCOL)
    rc, report = run_json(outside, "--backend", "acme.old", "--only", "schedule/step-size-49-boundaries",
                          "--only", "schedule/plateau-nan-is-bad", "--only", "optimizer/ema-torch-sgd",
                          "--only", "schedule/step-two-groups", "--only", "optimizer/seed-sgd-1d",
                          "--only", "optimizer/error-state-shape")
    got = {r["case"]: (r["status"], r["message"]) for r in report["results"]}
    assert got["schedule/step-size-49-boundaries"] == (
        "unsupported", "unsupported: backend acme.old: schedules.schedule_values takes no at")
    assert got["schedule/plateau-nan-is-bad"] == (
        "unsupported", "unsupported: backend acme.old: schedules.schedule_values takes no metrics")
    assert got["optimizer/ema-torch-sgd"] == (
        "unsupported", "unsupported: backend acme.old: optimizers.run_trajectory takes no ema")
    # the rest runs; an error case's [expected] has no ema and still reaches the backend's check
    assert {c for c, (s, _) in got.items() if s == "passed"} == {
        "schedule/step-two-groups", "optimizer/seed-sgd-1d", "optimizer/error-state-shape"}
    assert rc == 0
