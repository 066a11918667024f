"""Every conformance case on every chosen backend, one pytest test each (conformance.suite.plugin)."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.harness.runner import run_case


def test_case(twinstep_case: tuple[str, Any, Any]) -> None:
    what, item, backend = twinstep_case
    if what == "broken":
        pytest.fail(item.message, pytrace=False)
    result = run_case(item, backend)
    if result.status == "unsupported":
        pytest.skip(result.message)
    if result.status != "passed":
        pytest.fail(result.message, pytrace=False)
