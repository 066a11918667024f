"""Case kinds. Each kind is a plugin module `conformance.harness.kinds.<kind>` defining:

- `REQUIRED_SECTIONS`: spec tables a case of this kind must have (e.g. ``("loss",)``);
- optionally `USED_SECTIONS`: every spec table the kind reads (default: REQUIRED_SECTIONS); a case
  file with any other table is refused naming the file and the table;
- `Inputs`, `Expected`: strict models (`CaseTable`) for `[inputs]` and `[expected]`;
- `run(case, backend) -> dict`: run the case on a backend (through the backend's twin functions)
  and return the values to compare, keyed like `[expected]`;
- optionally `check_case(case)`: cross-checks between inputs, expected and spec (raise ValueError);
- optionally `expected_values(case) -> dict`: the expected values as compared (default: the raw
  `[expected]` table).
"""
