"""pytest plugin: the `--twinstep-*` options and the parametrization of `conformance.suite`'s test.

Inert unless a test asks for the `twinstep_case` argument: registering the plugin in every pytest
run of an environment only adds the options.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.errors import TwinstepError
from conformance.harness.backends import get_backends
from conformance.harness.case import collect_cases
from conformance.harness.runner import broken_results, runs_on


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("twinstep", "twinstep conformance cases (pytest --pyargs conformance.suite)")
    group.addoption("--twinstep-backend", action="append", metavar="NAME",
                    help="backend to run (repeatable): torch, jax, oracle, all (default), a registered name "
                         "or the dotted name of a package (docs/backends.md)")
    group.addoption("--twinstep-cases", action="append", metavar="DIR",
                    help="case files or directories (default: the bundled suite; repeatable)")
    group.addoption("--twinstep-only", action="append", metavar="GLOB",
                    help="only case ids matching this glob, e.g. 'loss/*' (repeatable)")


BACKENDS = pytest.StashKey[list]()


def pytest_configure(config: pytest.Config) -> None:
    names = config.getoption("twinstep_backend")
    if names:  # resolved once, before collection: a backend that cannot be imported is a usage error
        try:
            config.stash[BACKENDS] = get_backends(names)
        except TwinstepError as exc:
            raise pytest.UsageError(f"twinstep: {exc}") from None


def _params(config: pytest.Config) -> list[Any]:
    backends = config.stash[BACKENDS] if BACKENDS in config.stash else get_backends("all")
    try:
        cases, broken = collect_cases(config.getoption("twinstep_cases"), config.getoption("twinstep_only"))
    except TwinstepError as exc:  # a missing case directory
        raise pytest.UsageError(f"twinstep: {exc}") from None
    params = [pytest.param(("broken", r, None), id=f"{r.case}[case-file]") for r in broken_results(broken)]
    params += [pytest.param(("case", c, b), id=f"{c.id}[{b.name}]") for c in cases for b in backends if runs_on(c, b)]
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "twinstep_case" in metafunc.fixturenames:
        metafunc.parametrize("twinstep_case", _params(metafunc.config))
