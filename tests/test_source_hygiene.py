"""Source hygiene: comments give reasons, not tracker numbers; tools/ stands on its own (it imports
nothing from the test suite). Each check with a negative control."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


ISSUE_NUMBER = re.compile(r"\bissue\s+#?\d+", re.IGNORECASE)
SOURCE_DIRS = ("conformance", "ref_torch", "ref_jax", "natives", "tools", "bench", "tests")


def issue_numbers(text: str) -> list[str]:
    """The tracker references a source holds ("issue" and a number): comments give reasons, not provenance."""
    return [m.group(0) for m in ISSUE_NUMBER.finditer(text)]


def test_no_source_names_an_issue_number() -> None:
    root = ROOT
    found = {str(p.relative_to(root)): issue_numbers(p.read_text()) for d in SOURCE_DIRS
             for p in sorted((root / d).rglob("*.py"))}
    assert len(found) > 200
    assert {p: hits for p, hits in found.items() if hits} == {}


def test_negative_control_an_issue_number_is_seen() -> None:
    assert issue_numbers("# fixed for Issue " + "12, item 3") == ["Issue " + "12"]
    assert issue_numbers('"""see issue' + ' #7"""') == ["issue" + " #7"]
    assert issue_numbers("goals (issue" + "\n14)") == ["issue" + "\n14"]  # across a line break
    assert issue_numbers("# the issue's example, two issues") == []


def imports_from_tests(source: str) -> list[str]:
    """What a tool takes from the test suite: imports of its modules (support.*, test_*, tests.*)
    and a sys.path entry naming tests/."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [n for n in names if n.split(".")[0] in ("support", "tests") or n.startswith("test_")]
        if isinstance(node, ast.Constant) and node.value == "tests":
            found.append('"tests" (a path)')
    return found


def test_tools_import_nothing_from_the_tests() -> None:
    tools = sorted((ROOT / "tools").glob("*.py"))
    assert len(tools) > 5
    assert {p.name: f for p in tools if (f := imports_from_tests(p.read_text()))} == {}


def test_negative_control_a_tool_importing_the_tests_is_seen() -> None:
    source = 'import sys\nsys.path.insert(0, str(ROOT / "tests"))\nfrom support.port import x\nimport test_port_code\n'
    assert sorted(imports_from_tests(source)) == ['"tests" (a path)', "support.port", "test_port_code"]
