"""Reports of `twinstep conform`: JUnit XML, the Markdown matrix with ledger rows,
JSON with a status, and the terminal's kind × backend summary. Each check has a negative control."""

from __future__ import annotations

import io
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.harness.ledger import explain, parse_ledger
from conformance.harness.report import (
    junit_xml,
    markdown_report,
    print_rows,
    print_summary,
    summary_table,
)
from conformance.harness.runner import Result

R = [
    Result("loss/a", "torch", True, 1e-17, 1e-16, "", kind="loss"),
    Result("loss/a", "native", False, 0.5, 0.25, "value: got 1, want 0.5", kind="loss"),
    Result("loss/b", "native", False, None, None, "unsupported: losses.loss_value_and_grad", "unsupported", "loss"),
    Result("optimizer/c", "torch", False, 2.0, 1.0, "params[0].w: got 2, want 0", kind="optimizer"),
    Result("cases/x.toml", "-", False, None, None, "cases/x.toml: [schedule] is not read", "failed", "", "cases/x.toml",
           "[schedule]", "is not read"),
]
LEDGER = """
<a id="losses"></a>
| id | difference | recipe | pinned by |
| --- | --- | --- | --- |
| L-A | a differs | twinstep does x | case `loss/a`, `test_something` |
<a id="optimizers"></a>
| O-C | c differs | y | cases `torch-*-open`, `case-{1,2}` |
"""


def test_junit_xml_parses_with_one_testcase_per_case_and_backend() -> None:
    root = ET.fromstring(junit_xml(R))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("5", "3", "1")
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"torch", "native", "case-files"}
    cases = list(root.iter("testcase"))
    assert len(cases) == len(R)
    by_name = {c.get("name"): c for c in cases}
    assert by_name["loss/a[native]"].get("classname") == "loss"
    assert by_name["loss/a[native]"].find("failure").get("message") == "value: got 1, want 0.5"
    assert by_name["loss/b[native]"].find("skipped") is not None
    assert by_name["loss/a[torch]"].find("failure") is None and by_name["loss/a[torch]"].find("skipped") is None
    assert by_name["cases/x.toml"].find("failure") is not None
    for s in suites.values():  # the counts of each suite are its own test cases'
        kids = s.findall("testcase")
        assert int(s.get("tests")) == len(kids)
        assert int(s.get("failures")) == sum(k.find("failure") is not None for k in kids)
        assert int(s.get("skipped")) == sum(k.find("skipped") is not None for k in kids)


def test_negative_control_a_passing_result_is_not_a_junit_failure() -> None:
    flipped = [Result(r.case, r.backend, True, r.max_abs_err, r.max_rel_err, "", kind=r.kind) for r in R[:4]]
    root = ET.fromstring(junit_xml(flipped))
    assert root.get("failures") == "0" and not list(root.iter("failure"))


def test_the_ledger_names_cases_by_glob_and_by_section() -> None:
    rows = parse_ledger(LEDGER)
    assert [(r.id, r.kind) for r in rows] == [("L-A", "loss"), ("O-C", "optimizer")]
    assert rows[0].cases == ("loss/a",)  # `test_something` is a test, not a case
    assert rows[1].cases == ("optimizer/torch-*-open", "optimizer/case-1", "optimizer/case-2")
    assert explain(rows, "optimizer/torch-adam-open") == ["O-C"]
    assert explain(rows, "optimizer/c") == []  # negative control: a case no row names


def test_the_markdown_report_is_a_matrix_with_worst_errors_and_ledger_rows() -> None:
    text = markdown_report(R, parse_ledger(LEDGER))
    assert "| case | torch | native | ledger |" in text
    assert "| `loss/a` | pass 1.0e-17 | **FAIL** 5.0e-01 | native: L-A |" in text
    assert "| `loss/b` | · | unsupported | - |" in text
    assert "| `optimizer/c` | **FAIL** 2.0e+00 | · | - |" in text  # a built-in's failure is a bug, not a divergence
    assert "- `loss/a` [native]: value: got 1, want 0.5" in text
    unexplained = markdown_report(R, [])  # negative control: with no ledger row the failure says so
    assert "| `loss/a` | pass 1.0e-17 | **FAIL** 5.0e-01 | native: no row |" in unexplained


def test_the_terminal_summary_counts_each_kind_and_backend() -> None:
    table = summary_table(R)
    assert table[0] == ["kind", "torch", "native"]
    assert table[1:] == [["loss", "1/0/0", "0/1/1"], ["optimizer", "0/1/0", "-"], ["total", "1/1/0", "0/1/1"]]
    out = io.StringIO()
    print_rows([r for r in R if r.status == "failed"], out)
    print_summary(R, out)
    text = out.getvalue()
    assert "loss/a" in text and "loss/b" not in text  # unsupported rows only with --verbose
    assert "1 case file(s) could not be loaded" in text
    assert text.rstrip().endswith("total 1 passed, 3 failed, 1 unsupported")


def test_json_keeps_its_keys_and_adds_the_status() -> None:
    out = R[1].to_json()
    assert list(out)[:6] == ["case", "backend", "passed", "max_abs_err", "max_rel_err", "message"]
    assert out["status"] == "failed" and "key" not in out
    assert R[4].to_json()["key"] == "[schedule]"


CASE = """id = "loss/tiny-mse"
kind = "loss"
source = "hand calculation: (1 + 16) / 2 = 8.5"
[loss]
name = "mse"
[inputs]
prediction = [2.0, 5.0]
target = [3.0, 1.0]
[expected]
value = 8.5
"""


def test_the_cli_writes_every_report(tmp_path, capsys) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "good.toml").write_text(CASE)
    (cases / "wrong.toml").write_text(CASE.replace("tiny-mse", "tiny-mse-wrong").replace("8.5", "8.0"))
    (cases / "broken.toml").write_text(CASE.replace("tiny-mse", "broken") + "[clip]\nmax_norm = 1.0\n")
    out = {k: tmp_path / f"r.{k}" for k in ("json", "xml", "md")}
    rc = main(["conform", "--cases", str(cases), "--backend", "oracle", "--backend", "torch", "--json", str(out["json"]),
               "--junit", str(out["xml"]), "--report", str(out["md"])])
    assert rc == 1
    report = json.loads(out["json"].read_text())
    assert report["summary"] == {"passed": 2, "failed": 3, "unsupported": 0}
    root = ET.fromstring(out["xml"].read_text())
    assert (root.get("tests"), root.get("failures")) == ("5", "3")
    assert "| `loss/tiny-mse-wrong` | **FAIL** 5.0e-01 | **FAIL** 5.0e-01 | - |" in out["md"].read_text()
    shown = capsys.readouterr().out
    assert "loss/tiny-mse-wrong" in shown and "loss/tiny-mse " not in shown  # passing rows hidden by default
    assert "kind   oracle  torch" in shown and "loss   1/1/0   1/1/0" in shown
    assert main(["conform", "--cases", str(cases / "good.toml"), "--backend", "oracle", "-v"]) == 0
    assert "loss/tiny-mse  oracle" in capsys.readouterr().out


def test_no_report_is_left_half_written(tmp_path) -> None:
    from conformance.harness.report import write_atomic

    path = tmp_path / "r.json"
    write_atomic(path, "{}\n")
    assert path.read_text() == "{}\n" and [p.name for p in Path(tmp_path).iterdir()] == ["r.json"]


def test_the_ledger_audit_finds_unexplained_failures_and_rows_that_stopped_failing() -> None:
    from conformance.harness.ledger import audit

    rows = parse_ledger(LEDGER + "| O-D | d differs | z | **native fails** (rel ≤ 1) `optimizer/torch-*-open`, `loss/a` |\n")
    assert rows[-1].failing("native") == ("optimizer/torch-*-open", "loss/a") and rows[0].failing("native") == ()
    diff = "x[0]: got 1, want 2 (|diff| 1 > atol 0 + rtol 0·|want|)"
    results = [Result("loss/a", "native", False, 1.0, 0.5, diff, kind="loss"),
               Result("optimizer/torch-adam-open", "native", True, 0.0, 0.0, "", kind="optimizer"),
               Result("optimizer/z-new", "native", False, 1.0, 1.0, diff, kind="optimizer"),
               Result("optimizer/torch-adam-open", "torch", False, 1.0, 1.0, diff, kind="optimizer")]
    assert audit(results, rows, "native") == (
        ["optimizer/z-new"], ["O-D: optimizer/torch-adam-open passed", "O-D: optimizer/torch-*-open matches no failure"], [])
    assert explain(rows, "loss/a", "native") == ["O-D"]  # the listing row, not L-A, which only names the case
    assert explain(rows, "loss/a", "other") == ["L-A", "O-D"]  # a backend no row lists: every row naming it
    fixed = [results[0], Result("optimizer/torch-adam-open", "native", False, 1.0, 1.0, diff, kind="optimizer")]
    assert audit(fixed, rows, "native") == ([], [], [])  # negative control: every failure explained, every row showing
    assert audit(fixed[:1], rows, "native").stale == ["O-D: optimizer/torch-*-open matches no failure"]


_FAILURES = {  # the harness's own messages (runner.py, compare.py) and the kind the ledger calls each
    "x[0]: got 1, want 2 (|diff| 1 > atol 0 + rtol 0·|want|)": "difference",
    "x[1]: got nan, want 2 (|diff| nan > atol 0 + rtol 0·|want|)": "NaN",
    "x: shape (2,) does not match the expected (3,)": "shape",
    "grad[4][1]: relative error 0.015 at |want| 0.000193 passes only by atol 0.001 (0 would pass too): ...": "atol",
    "NonFiniteError: the gradient norm is nan": "NonFiniteError",
    "raised ConfigError: bad; expected InputError containing 'x'": "ConfigError",
    "expected InputError but the backend returned normally": "no error",
    "backend keras crashed on case loss/a: TypeError: 'int' object is not iterable at x/y.py:3": "crash",
    "value: missing from the backend's result": "other",
}


@pytest.mark.parametrize("message", list(_FAILURES))
def test_each_way_a_case_fails_has_its_ledger_word(message: str) -> None:
    from conformance.harness.ledger import failure_of

    finite = _FAILURES[message] != "NaN"
    assert failure_of(Result("loss/a", "native", False, 1.0 if finite else math.inf, 0.5, message)) == _FAILURES[message]


@pytest.mark.parametrize("stated, message, abs_err, rel_err, wrong", [
    ("rel ≤ 1e-7", "x[0]: got 1, want 1 (|diff| 1e-8 > atol 0 + rtol 0·|want|)", 1e-8, 9e-8, ""),
    ("rel ≤ 1e-7", "x[0]: got 1, want 1 (|diff| 1e-8 > atol 0 + rtol 0·|want|)", 1e-8, 1.1e-6, "above the row's"),
    ("abs <= 1e-7", "x[0]: got 1, want 1 (|diff| 1e-8 > atol 0 + rtol 0·|want|)", 1e-8, math.inf, ""),
    ("rel ≤ 1e-7", "x[0]: got 1, want 1 (|diff| 1e-8 > atol 0 + rtol 0·|want|)", 1e-8, math.inf, "above the row's"),
    ("rel ≤ 1", "backend k crashed on case loss/a: TypeError: x", None, None, "fails by crash"),
    ("NaN", "x[1]: got nan, want 2 (|diff| nan > atol 0 + rtol 0·|want|)", math.inf, math.inf, ""),
    ("NaN", "x[0]: got 1, want 2 (|diff| 1 > atol 0 + rtol 0·|want|)", 1.0, 0.5, "fails by difference"),
    ("NonFiniteError", "NonFiniteError: the gradient norm is nan", None, None, ""),
    ("NonFiniteError", "ConfigError: bad", None, None, "fails by ConfigError"),
    ("", "x[0]: got 1, want 2 (|diff| 1 > atol 0 + rtol 0·|want|)", 1.0, 0.5, "states no kind"),
    ("close", "x[0]: got 1, want 2 (|diff| 1 > atol 0 + rtol 0·|want|)", 1.0, 0.5, "is no kind of failure"),
])
def test_a_row_holds_only_when_the_case_fails_as_it_states(stated, message, abs_err, rel_err, wrong) -> None:
    from conformance.harness.ledger import holds

    got = holds(stated, Result("loss/a", "native", False, abs_err, rel_err, message))
    assert (wrong in got and got) if wrong else got == ""


@pytest.mark.parametrize("row, rc, words", [
    ("**torch fails** (rel ≤ 1) `loss/tiny-mse-wrong`", 0, "1 failure(s) listed there, 0 not"),
    ("", 1, "not in the ledger: loss/tiny-mse-wrong[torch]: failed, and no ledger row lists it"),  # control
    ("**torch fails** (NaN) `loss/tiny-mse-wrong`", 1, "fails by difference, the row says NaN"),  # control
    ("**keras fails** (rel ≤ 1) `loss/tiny-mse-wrong`", 1, "no ledger row lists it"),  # control: another backend
])
def test_ledger_gate_exits_0_only_when_every_failure_is_listed_as_it_fails(tmp_path, capsys, row: str, rc: int,
                                                                          words: str) -> None:
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "good.toml").write_text(CASE)
    (cases / "wrong.toml").write_text(CASE.replace("tiny-mse", "tiny-mse-wrong").replace("8.5", "8.0"))
    ledger = tmp_path / "ledger.md"
    ledger.write_text(LEDGER + f"| L-W | w differs | z | case `loss/tiny-mse-wrong` {row} |\n")
    assert main(["conform", "--cases", str(cases), "--backend", "torch", "--ledger", str(ledger)]) == rc
    assert words in capsys.readouterr().out
    assert main(["conform", "--cases", str(cases), "--backend", "torch"]) == 1  # without --ledger: a failure


def test_ledger_gate_on_a_native_backend_with_the_bundled_ledger(tmp_path, capsys) -> None:
    only = ["--only", "schedule/warmup-cosine-no-warmup", "--only", "schedule/linear-defaults", "--jobs", "1"]
    assert main(["conform", "--backend", "torch-native", "--ledger", *only]) == 0
    assert "1 failure(s) listed there, 0 not" in capsys.readouterr().out
    assert main(["conform", "--backend", "torch-native", *only]) == 1
    assert main(["conform", "--backend", "torch-native", "--ledger", str(tmp_path / "none.md"), *only]) == 2
    assert "no divergence ledger rows in" in capsys.readouterr().err
