"""Comparisons that cannot hide a relative error: an element whose pass rests on atol alone at a value
below it (0 < |want| < atol, |got − want| > rtol·|want|) is named with its relative error, and the
harness refuses such a pass unless the case's `[tolerance] why` gives the derived bound. Negative
controls: the same case without `why` fails; a value 0 (no relative error) and a pass within rtol are
never flagged. tests/test_cases.py applies the rule to every bundled case on every backend; the
native backends' passes that rest on atol are ledger rows (tests/test_native_backends.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conformance.cli import main
from conformance.harness.backends import Backend
from conformance.harness.case import load_case
from conformance.harness.compare import compare
from conformance.harness.runner import run_case

# ℓ = mean((x − y)²) with x = 1 + 1e-15, y = 1: the exact value is 1e-30, but float64 holds x as
# 1 + 1.110223e-15 (one ulp of 1 is 2.22e-16), so every backend computes 1.2326e-30: 23 % away
CASE = """id = "loss/tiny-difference"
kind = "loss"
source = "hand calculation: (1e-15)² = 1e-30"
[loss]
name = "mse"
[inputs]
prediction = [1.000000000000001]
target = [1.0]
[expected]
value = 1e-30
"""
WHY = '[tolerance]\natol = 1e-29\nrtol = 1e-10\nwhy = "x − y of two numbers near 1 is known to one ulp of 1 (2.2e-16), so its square to 4.4e-31 per ulp"\n'


def test_compare_names_the_array_and_the_relative_error_where_atol_carried() -> None:
    got = {"value": np.array([1.0, 1.013e-14, 1e-17, 5e-13, 2e-15]), "grad": np.array([2.0])}
    want = {"value": np.array([1.0, 1.0e-14, 0.0, 5e-13 * (1 + 1e-11), 2.001e-15]), "grad": np.array([2.0])}
    cmp = compare(got, want, 1e-12, 1e-10)  # the worst element of each array: value[1], not value[4]
    assert cmp.passed and cmp.atol_carried == ("value[1]: relative error 0.013 at |want| 1e-14",)
    assert compare(got, want, 1e-12, 0.02).atol_carried == ()  # within rtol everywhere


def test_compare_does_not_flag_zeros_or_passes_within_rtol() -> None:
    assert compare(np.array([1e-17]), np.array([0.0]), 1e-12, 1e-10).atol_carried == ()  # no relative error at 0
    assert compare(np.array([1e-14 * (1 + 1e-11)]), np.array([1e-14]), 1e-12, 1e-10).atol_carried == ()
    assert compare(np.array([2e-12]), np.array([1e-12 + 1e-13]), 1e-12, 1e-10).atol_carried == ()  # |want| ≥ atol


@pytest.mark.parametrize("backend", ["torch", "jax", "oracle"])
def test_a_pass_that_rests_on_atol_fails_without_why(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "case.toml"
    path.write_text(CASE)
    result = run_case(load_case(path), Backend(backend))
    assert not result.passed and result.status == "failed"
    assert result.message.startswith("value: relative error 0.23 at |want| 1e-30 passes only by atol 1e-12 ")


@pytest.mark.parametrize("backend", ["torch", "jax", "oracle"])
def test_why_lets_it_pass_and_the_report_still_shows_it(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "case.toml"
    path.write_text(CASE + WHY)
    result = run_case(load_case(path), Backend(backend))
    assert result.passed and result.atol_carried == ("value: relative error 0.23 at |want| 1e-30",)
    assert result.to_json()["atol_carried"] == ["value: relative error 0.23 at |want| 1e-30"]


def test_the_cli_report_lists_passes_that_rest_on_atol(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "case.toml").write_text(CASE + WHY)
    code = main(["conform", "--backend", "oracle", "--cases", str(tmp_path), "--jobs", "1", "-v",
                 "--json", str(tmp_path / "out.json"), "--report", str(tmp_path / "out.md")])
    assert code == 0
    assert "atol carried value: relative error 0.23" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())["results"][0]["atol_carried"]
    assert "## Passes that rest on atol" in (tmp_path / "out.md").read_text()
