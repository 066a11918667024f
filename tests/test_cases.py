"""Every bundled conformance case on every backend it names: ids like `loss/seed-mse[jax]`."""

from __future__ import annotations

import pytest

from conformance.harness.backends import Backend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case

CASES = load_cases()
PARAMS = [pytest.param(c, b, id=f"{c.id}[{b}]") for c in CASES for b in c.backends]


@pytest.mark.parametrize(("case", "backend_name"), PARAMS)
def test_case(case, backend_name: str) -> None:
    result = run_case(case, Backend(backend_name))
    assert result.passed, result.message
