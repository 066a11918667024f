"""The conformance cases as a pytest suite, for running them inside a user's own test suite:

    pytest --pyargs conformance.suite --twinstep-backend NAME [--twinstep-cases DIR] [--twinstep-only GLOB]

Each case × backend is one test, with ids like `test_case[optimizer/adamw-param-groups[NAME]]`;
an unsupported case is skipped with its reason, a case file that cannot be loaded is a failed test.
The options come from the pytest plugin `conformance.suite.plugin`, which the `twinstep`
distribution registers under pytest's `pytest11` entry points (without an installed distribution:
`pytest -p conformance.suite.plugin --pyargs conformance.suite ...`). docs/backends.md.
"""
