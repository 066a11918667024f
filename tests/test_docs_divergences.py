"""docs/divergences.md names, for every row, the test that pins it: each named test must exist, so a
renamed or deleted pin cannot leave a row unpinned."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "divergences.md"


def _defined_tests() -> dict[str, set[str]]:
    return {f"tests/{f.name}": set(re.findall(r"^(?:async )?def (test_\w+)", f.read_text(), re.M))
            for f in (ROOT / "tests").glob("test_*.py")}


def _missing(text: str) -> list[str]:
    defined = _defined_tests()
    everywhere = set().union(*defined.values())
    missing = []
    for file, names in re.findall(r"(tests/test_\w+\.py)((?:::test_\w+|`?,? ?`?::test_\w+)*)", text):
        if file not in defined:
            missing.append(file)
        missing += [f"{file}::{n}" for n in re.findall(r"::(test_\w+)", names) if n not in defined.get(file, ())]
    for name, glob in re.findall(r"`(?:::)?(test_\w+)(\*?)", text):
        if not (any(t.startswith(name) for t in everywhere) if glob else name in everywhere):
            missing.append(name + glob)
    return sorted(set(missing))


def test_every_pinning_test_named_in_the_doc_exists() -> None:
    missing = _missing(DOC.read_text())
    assert not missing, f"docs/divergences.md names tests that do not exist: {missing}"


def test_the_check_sees_a_missing_test() -> None:
    # negative control: made-up pins in each of the doc's three spellings are reported
    row = "| X | a | b | `test_made_up_pin`; `tests/test_clipping.py::test_made_up_too`; `test_made_up_glob_*` |"
    assert _missing(row) == ["test_made_up_glob_*", "test_made_up_pin", "tests/test_clipping.py::test_made_up_too"]
