"""Run cases on backends and compare with the expected values.

Every (case, backend) pair gives one Result with a status: "passed", "failed" (wrong values, an
unexpected error, a crash, a case file that could not be loaded) or "unsupported" (the backend lacks
a function the case needs, or raised UnsupportedError saying why it cannot run the case).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from conformance import heap
from conformance.errors import TwinstepError, UnsupportedError
from conformance.harness.backends import Backend, MissingFunction
from conformance.harness.case import BACKENDS, BrokenCase, Case, kind_module
from conformance.harness.compare import compare

STATUSES: tuple[str, ...] = ("passed", "failed", "unsupported")
NO_BACKEND = "-"  # the backend column of a case file that could not be loaded


@dataclass
class Result:
    case: str
    backend: str
    passed: bool
    max_abs_err: float | None
    max_rel_err: float | None
    message: str
    status: str = ""  # passed | failed | unsupported; empty: from `passed`
    kind: str = ""
    file: str = ""
    key: str = ""  # a case file that could not be loaded: the key at fault ...
    reason: str = ""  # ... and why
    atol_carried: tuple[str, ...] = ()  # arrays whose pass rests on atol at values below it (compare.py)

    def __post_init__(self) -> None:
        if not self.status:
            self.status = "passed" if self.passed else "failed"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("max_abs_err", "max_rel_err"):  # strict JSON has no NaN/Infinity
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = None
        if not self.key:
            del out["key"], out["reason"]
        if self.atol_carried:
            out["atol_carried"] = list(self.atol_carried)
        else:
            del out["atol_carried"]
        return out


def _result(case: Case, backend: Backend, passed: bool, message: str, status: str = "",
            abs_err: float | None = None, rel_err: float | None = None) -> Result:
    return Result(case.id, backend.name, passed, abs_err, rel_err, message, status, case.kind, str(case.path))


def run_case(case: Case, backend: Backend) -> Result:
    """Run one case on one backend. Never raises: every problem becomes a failed Result."""
    module = kind_module(case.kind)
    if module is None:
        return _result(case, backend, False, f"kind {case.kind!r} is not supported by this harness yet")
    try:
        with backend.context():
            got = module.run(case, backend)
    except MissingFunction as exc:
        return _result(case, backend, False, f"unsupported: {exc.what}", "unsupported")
    except UnsupportedError as exc:
        if case.expects_error and case.expected.error in ("UnsupportedError", "TwinstepError"):
            return _error_result(case, backend, exc)
        return _result(case, backend, False, f"unsupported: {exc}", "unsupported")
    except TwinstepError as exc:
        return _error_result(case, backend, exc)
    except Exception as exc:  # a crash in a backend is a failure of that backend, not of the run
        if case.expects_error and isinstance(exc, AttributeError) and exc.obj is case.expected:  # read after it returned
            return _result(case, backend, False, f"expected {case.expected.error} but the backend returned normally")
        return _result(case, backend, False, crash_message(case, backend, exc))
    if case.expects_error:
        return _result(case, backend, False, f"expected {case.expected.error} but the backend returned normally")
    want = module.expected_values(case) if hasattr(module, "expected_values") else case.raw_expected
    cmp = compare(got, want, case.atol, case.rtol)
    result = _result(case, backend, cmp.passed, cmp.message, "", cmp.max_abs_err, cmp.max_rel_err)
    result.atol_carried = cmp.atol_carried
    if cmp.passed and cmp.atol_carried and not case.tolerance_why:
        result.passed, result.status = False, "failed"
        result.message = (f"{cmp.atol_carried[0]} passes only by atol {case.atol:g} (0 would pass too): give "
                          "expected values exact enough to compare relatively, or [tolerance] why = the derived "
                          "bound that makes this atol right")
    return result


def crash_message(case: Case, backend: Backend, exc: BaseException) -> str:
    """One line naming the backend, the case, the exception and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {'/'.join(frames[-1].filename.rsplit('/', 2)[-2:])}:{frames[-1].lineno}" if frames else ""
    text = " ".join(str(exc).split())
    return f"backend {backend.name} crashed on case {case.id}: {type(exc).__name__}: {text}{where}"


def _error_result(case: Case, backend: Backend, exc: TwinstepError) -> Result:
    name = type(exc).__name__
    if not case.expects_error:
        return _result(case, backend, False, f"{name}: {exc}")
    want = case.expected
    ok = any(c.__name__ == want.error for c in type(exc).__mro__) and want.message in str(exc)
    msg = "" if ok else f"raised {name}: {exc}; expected {want.error} containing {want.message!r}"
    return _result(case, backend, ok, msg)


def runs_on(case: Case, backend: Backend) -> bool:
    """A case's `backends` list selects among the built-ins it can name; other backends run every case."""
    return backend.name in case.backends or backend.name not in BACKENDS


# JAX keeps ~1.4 MB per compiled program and the suite compiles ~1,300 (2.3 GB). A release recompiles
# what later cases share, so rarer is faster: once the process holds more than RELEASE_ABOVE_MIB and
# has grown RELEASE_GROWTH_MIB since the last release (or, where its resident size cannot be read,
# every RELEASE_EVERY cases), every backend in it releases what it keeps.
RELEASE_ABOVE_MIB = 800
RELEASE_GROWTH_MIB = 320
RELEASE_EVERY = 40


class Releases:
    """When the backends of this process release what they keep between cases (backend.release())."""

    def __init__(self, backends: Sequence[Backend]) -> None:
        self.backends = list(backends)
        self.ran = 0
        self.after_last: float = 0.0  # resident MiB after the last release

    def case_done(self) -> None:
        """Count one case run; release if the memory (or the count) says so."""
        self.ran += 1
        resident = heap.resident_mib()
        if resident is None:
            due = self.ran % RELEASE_EVERY == 0
        else:
            due = resident > max(RELEASE_ABOVE_MIB, self.after_last + RELEASE_GROWTH_MIB)
        if due:
            for backend in self.backends:
                backend.release()
            self.after_last = heap.resident_mib() or 0.0


def run_cases(cases: Sequence[Case], backends: Sequence[Backend]) -> list[Result]:
    out: list[Result] = []
    releases = Releases(backends)
    for case in cases:
        for backend in backends:
            if runs_on(case, backend):
                out.append(run_case(case, backend))
                releases.case_done()
    return out


def broken_results(broken: Sequence[BrokenCase]) -> list[Result]:
    """One failed Result per case file that could not be loaded (backend "-")."""
    return [Result(b.id or str(b.path), NO_BACKEND, False, None, None, b.message, "failed", b.kind or "",
                   str(b.path), b.key, b.reason) for b in broken]


def summarize(results: Sequence[Result]) -> dict[str, int]:
    """{"passed": n, "failed": n, "unsupported": n}."""
    return {s: sum(r.status == s for r in results) for s in STATUSES}
