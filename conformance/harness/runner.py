"""Run cases on backends and compare with the expected values."""

from __future__ import annotations

import math
import traceback
from dataclasses import asdict, dataclass
from typing import Any

from conformance.errors import TwinstepError
from conformance.harness.backends import Backend
from conformance.harness.case import Case, kind_module
from conformance.harness.compare import compare


@dataclass
class Result:
    case: str
    backend: str
    passed: bool
    max_abs_err: float | None
    max_rel_err: float | None
    message: str

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("max_abs_err", "max_rel_err"):  # strict JSON has no NaN/Infinity
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = None
        return out


def run_case(case: Case, backend: Backend) -> Result:
    """Run one case on one backend. Never raises: every problem becomes a failed Result."""
    module = kind_module(case.kind)
    if module is None:
        return Result(case.id, backend.name, False, None, None,
                      f"kind {case.kind!r} is not supported by this harness yet")
    try:
        with backend.context():
            got = module.run(case, backend)
    except TwinstepError as exc:
        return _error_result(case, backend, exc)
    except Exception as exc:  # a crash in a backend is a failure of that backend, not of the run
        if case.expects_error and isinstance(exc, AttributeError) and exc.obj is case.expected:  # read after it returned
            return Result(case.id, backend.name, False, None, None, f"expected {case.expected.error} but the backend returned normally")
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" at {frame.filename.rsplit('/', 2)[-2:]}:{frame.lineno}" if frame else ""
        return Result(case.id, backend.name, False, None, None,
                      f"crashed: {type(exc).__name__}: {exc}{where}".replace("\n", " "))
    if case.expects_error:
        return Result(case.id, backend.name, False, None, None,
                      f"expected {case.expected.error} but the backend returned normally")
    want = module.expected_values(case) if hasattr(module, "expected_values") else case.raw_expected
    cmp = compare(got, want, case.atol, case.rtol)
    return Result(case.id, backend.name, cmp.passed, cmp.max_abs_err, cmp.max_rel_err, cmp.message)


def _error_result(case: Case, backend: Backend, exc: TwinstepError) -> Result:
    name = type(exc).__name__
    if not case.expects_error:
        return Result(case.id, backend.name, False, None, None, f"{name}: {exc}")
    want = case.expected
    ok = any(c.__name__ == want.error for c in type(exc).__mro__) and want.message in str(exc)
    msg = "" if ok else f"raised {name}: {exc}; expected {want.error} containing {want.message!r}"
    return Result(case.id, backend.name, ok, None, None, msg)


def run_cases(cases: list[Case], backends: list[Backend]) -> list[Result]:
    results: list[Result] = []
    for case in cases:
        for backend in backends:
            if backend.name in case.backends:
                results.append(run_case(case, backend))
    return results


def summarize(results: list[Result]) -> dict[str, int]:
    passed = sum(r.passed for r in results)
    return {"passed": passed, "failed": len(results) - passed}
