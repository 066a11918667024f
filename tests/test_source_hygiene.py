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


SHARED_RUN = 5  # lines: enough to be a copied loop body, more than a shared import block


def _code_lines(source: str) -> list[str]:
    """The file's code lines, stripped, without blanks, comments, docstrings' text or imports."""
    lines = []
    for raw in source.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", "import ", "from ", '"', "'")):
            lines.append(line)
    return lines


def shared_runs(a: str, b: str, run: int = SHARED_RUN) -> list[str]:
    """Runs of `run` consecutive code lines that two sources both hold (the first line of each)."""
    la, lb = _code_lines(a), _code_lines(b)
    windows = {tuple(lb[i:i + run]) for i in range(len(lb) - run + 1)}
    return [la[i] for i in range(len(la) - run + 1) if tuple(la[i:i + run]) in windows]


def test_no_native_backend_shares_code_with_a_case_generator() -> None:
    """A native backend is graded on cases tools/ writes: a copy of the generator would grade itself."""
    natives = sorted((ROOT / "natives").rglob("*.py"))
    tools = sorted((ROOT / "tools").glob("*.py"))
    assert len(natives) > 10 and len(tools) > 5
    found = {f"{n.relative_to(ROOT)} ~ {t.relative_to(ROOT)}": runs for n in natives for t in tools
             if (runs := shared_runs(n.read_text(), t.read_text()))}
    assert found == {}


def test_negative_control_a_copied_loop_is_seen() -> None:
    loop = ("    for ok in finite:\n        opt.zero_grad(set_to_none=True)\n        scaler.scale(loss).backward()\n"
            "        out['scale'].append(scaler.get_scale())\n        scaler.step(opt)\n        scaler.update()\n")
    native = "import torch\n\ndef trace(finite):\n    out = {}\n" + loop + "    return out\n"
    generator = "from x import y\n\ndef run(finite, args):\n    # the generator\n" + loop.replace("    ", "  ")
    assert shared_runs(native, generator) == ["for ok in finite:", "opt.zero_grad(set_to_none=True)"]
    assert shared_runs(native, generator.replace("scaler.step(opt)", "scaler.step(sgd)")) == []
