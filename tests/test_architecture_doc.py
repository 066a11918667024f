"""docs/architecture.md's module list equals the source tree, so the contributors' map cannot rot.

What the page lists, read by structure rather than by known names:

- the code block under "## Layout": one entry a line, its first word the path and the rest its
  purpose. Two spaces of indentation are one level: a line's path is relative to the nearest entry
  one level up, which must be a directory (`name/`). A line indented deeper than one level below the
  entry before it continues that entry's purpose.
- the tables under "### The twins": the first column is a backticked module name. A `side` column
  names the one twin that has the module; columns named after the twins give each twin's purpose;
  a table with neither lists modules both twins have.

What exists: under conformance/, natives/, ref_torch/ and ref_jax/ (skipping __pycache__), every
`*.py` file and every directory holding one at any depth (packages and namespace packages alike).

The `__init__.py` rule: a package's `__init__.py` is the package itself. The tree yields the
directory (`config/`), never `config/__init__.py`, and a listed `__init__.py` is flagged: the
package's own line says what it holds. A listed directory with no Python below it (`cases/`,
`assets/`: data) is not required, but must exist.

Each check has negative controls on a synthetic page and tree in tmp_path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TOPS = ("conformance", "natives", "ref_torch", "ref_jax")
TWINS = ("ref_torch", "ref_jax")
INDENT = 2
MODULE_CELL = re.compile(r"`(\w+)`")


class Entry(NamedTuple):
    """One listed package (`path/`) or module (`path.py`), relative to the repository root."""

    path: str
    purpose: str


class DocFormatError(ValueError):
    """The page's structure cannot be read: a malformed line is a failure, never a silent skip."""


def section(text: str, heading: str) -> list[str]:
    """The lines after `heading` up to the next heading of the same or a higher level."""
    lines = text.splitlines()
    try:
        start = lines.index(heading) + 1
    except ValueError:
        raise DocFormatError(f"no heading {heading!r}") from None
    end = next((i for i in range(start, len(lines)) if 0 < heading_level(lines[i]) <= heading_level(heading)),
               len(lines))
    return lines[start:end]


def heading_level(line: str) -> int:
    """The Markdown heading level of a line (`## x` is 2), 0 for any other line."""
    marker = line.split(" ")[0]
    return len(marker) if marker and set(marker) == {"#"} and line.startswith(marker + " ") else 0


def code_block(lines: list[str]) -> list[str]:
    """The first fenced code block among `lines`."""
    fences = [i for i, line in enumerate(lines) if line.startswith("```")]
    if len(fences) < 2:
        raise DocFormatError("the Layout section has no fenced code block")
    return lines[fences[0] + 1:fences[1]]


def parse_layout(block: list[str]) -> list[Entry]:
    """Every entry of the Layout block, with its full path built from the indentation."""
    entries: list[Entry] = []
    parents: list[str] = []  # parents[d] is the directory entry at depth d
    for number, line in enumerate(block, 1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if entries and indent > INDENT * len(parents):
            entries[-1] = entries[-1]._replace(purpose=f"{entries[-1].purpose} {line.strip()}")
            continue
        if indent % INDENT:
            raise DocFormatError(f"Layout line {number}: indentation {indent} is not a multiple of {INDENT}")
        depth = indent // INDENT
        if depth > len(parents):
            raise DocFormatError(f"Layout line {number}: indented with no entry above it")
        if depth and not parents[depth - 1].endswith("/"):
            raise DocFormatError(f"Layout line {number}: nested under {parents[depth - 1]!r}, not a directory")
        name, _, purpose = line.strip().partition(" ")
        path = (parents[depth - 1] if depth else "") + name
        parents[depth:] = [path]
        entries.append(Entry(path, purpose.strip()))
    return entries


def table_rows(lines: list[str]) -> list[list[list[str]]]:
    """Every Markdown table among `lines`: its rows of cells, header first, separator dropped."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in lines:
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            cells = [cell.strip() for cell in line.strip()[1:-1].split(" | ")]
            if not all(set(cell) <= {"-", ":"} for cell in cells):
                tables[-1].append(cells)
        previous = line
    return tables


def module_name(cell: str) -> str:
    """The module a first cell names: exactly one backticked name and nothing else."""
    match = MODULE_CELL.fullmatch(cell)
    if match is None:
        raise DocFormatError(f"twins' table: first cell {cell!r} is not one backticked module name")
    return match.group(1)


def twin_entries(header: list[str], row: list[str], twins: tuple[str, ...]) -> list[Entry]:
    """The modules one table row lists, by the table's kind (read from its header)."""
    name = module_name(row[0])
    columns = [cell.lower() for cell in header]
    if "side" in columns:
        side = row[columns.index("side")]
        if side not in twins:
            raise DocFormatError(f"twins' table: {name}'s side {side!r} is none of {twins}")
        return [Entry(f"{side}/{name}.py", row[-1])]
    own = [twin for twin in twins if twin in columns]
    if own:
        return [Entry(f"{twin}/{name}.py", row[columns.index(twin)]) for twin in own]
    return [Entry(f"{twin}/{name}.py", row[1]) for twin in twins]


def parse_twins(lines: list[str], twins: tuple[str, ...]) -> list[Entry]:
    """Every module the twins' tables list."""
    entries: list[Entry] = []
    for header, *rows in table_rows(lines):
        for row in rows:
            if len(row) != len(header):
                raise DocFormatError(f"twins' table: row {row} has {len(row)} cells, its header {len(header)}")
            entries += twin_entries(header, row, twins)
    return entries


def listed(text: str, tops: tuple[str, ...], twins: tuple[str, ...]) -> list[Entry]:
    """The page's entries under the checked top-level directories (tests/, tools/, ... are not)."""
    layout = parse_layout(code_block(section(text, "## Layout")))
    entries = layout + parse_twins(section(text, "### The twins"), twins)
    return [entry for entry in entries if entry.path.split("/")[0] in tops]


def holds_python(directory: Path) -> bool:
    """Whether a directory holds a `*.py` file at any depth (outside __pycache__)."""
    return any("__pycache__" not in path.parts for path in directory.rglob("*.py"))


def present(root: Path, tops: tuple[str, ...]) -> set[str]:
    """Every package (`dir/`) and module (`*.py` but __init__.py) under the checked directories."""
    found: set[str] = set()
    for top in tops:
        for path in [root / top, *(root / top).rglob("*")]:
            if "__pycache__" in path.parts:
                continue
            relative = path.relative_to(root).as_posix()
            if path.is_dir() and holds_python(path):
                found.add(relative + "/")
            elif path.suffix == ".py" and path.name != "__init__.py":
                found.add(relative)
    return found


def is_data(root: Path, path: str) -> bool:
    """A listed path that exists and holds no Python: data the page may mention but need not."""
    target = root / path
    if path.endswith("/"):
        return target.is_dir() and not holds_python(target)
    return target.is_file() and target.suffix != ".py"


def problems(text: str, root: Path, tops: tuple[str, ...] = TOPS, twins: tuple[str, ...] = TWINS) -> list[str]:
    """Everything that makes the page's list differ from the tree, one line each (empty: equal)."""
    entries = listed(text, tops, twins)
    paths = [entry.path for entry in entries]
    tree = present(root, tops)
    absent = sorted({p for p in paths if p not in tree and not is_data(root, p)})
    found = [f"listed but absent: {p}" if not p.endswith("/__init__.py")
             else f"listed as a module, but __init__.py is its package's line: {p}" for p in absent]
    found += [f"present but unlisted: {p}" for p in sorted(tree - set(paths))]
    found += [f"listed twice: {p}" for p in sorted({p for p in paths if paths.count(p) > 1})]
    found += [f"listed without a purpose: {e.path}" for e in entries if not e.purpose]
    return found


def test_doc_lists_every_module_and_nothing_else() -> None:
    """The page and the tree name the same packages and modules, each with its one-line purpose."""
    found = problems(DOC.read_text(encoding="utf-8"), ROOT)
    assert not found, "docs/architecture.md's module list vs the source tree:\n  " + "\n  ".join(found)


def test_the_parse_reaches_every_room() -> None:
    """The comparison is not vacuous: both sources cover each checked directory and both twins' tables."""
    paths = {entry.path for entry in listed(DOC.read_text(encoding="utf-8"), TOPS, TWINS)}
    for top in TOPS:
        assert f"{top}/" in paths and any(p.startswith(f"{top}/") and p != f"{top}/" for p in paths), top
    assert {"ref_torch/_fsdp.py", "ref_jax/_window.py", "ref_jax/update.py"} <= paths


SYNTHETIC_DOC = """# synthetic

## Layout

```
pkg/                  a package
  a.py                a module
  sub/                a namespace directory
    b.py              a module two levels down, whose purpose
                      goes on on a second line
  assets/             data, no Python
twin_a/               one twin
twin_b/               the other
other/                not checked
  gone.py             not checked either
```

### The twins

| public module | what it holds |
| --- | --- |
| `m` | in both twins |

| private module | twin_a | twin_b |
| --- | --- | --- |
| `_p` | a's | b's |

| framework-only private module | side | purpose |
| --- | --- | --- |
| `_only` | twin_a | only in twin a |

## After
"""
SYNTHETIC_TOPS = ("pkg", "twin_a", "twin_b")
SYNTHETIC_TWINS = ("twin_a", "twin_b")
SYNTHETIC_FILES = ("pkg/__init__.py", "pkg/a.py", "pkg/sub/b.py", "twin_a/__init__.py", "twin_a/m.py",
                   "twin_a/_p.py", "twin_a/_only.py", "twin_b/__init__.py", "twin_b/m.py", "twin_b/_p.py")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The synthetic page's clean twin: exactly the packages and modules it lists."""
    for name in SYNTHETIC_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('"""A module."""\n')
    (tmp_path / "pkg" / "assets").mkdir()
    (tmp_path / "pkg" / "assets" / "data.csv").write_text("1\n")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "stale.py").write_text("")
    return tmp_path


def synthetic(tree: Path, doc: str = SYNTHETIC_DOC) -> list[str]:
    """The comparator on the synthetic page and tree."""
    return problems(doc, tree, SYNTHETIC_TOPS, SYNTHETIC_TWINS)


def test_negative_control_the_clean_pair_passes(tree: Path) -> None:
    """The page that matches its tree has nothing flagged (data and __pycache__ ignored as they should)."""
    assert synthetic(tree) == []


def test_negative_control_the_parse_follows_indentation_and_tables() -> None:
    """Nesting, continuation lines and each table kind give the paths and purposes they mean."""
    entries = {e.path: e.purpose for e in listed(SYNTHETIC_DOC, SYNTHETIC_TOPS, SYNTHETIC_TWINS)}
    assert entries["pkg/sub/b.py"] == "a module two levels down, whose purpose goes on on a second line"
    assert entries["twin_a/_p.py"] == "a's" and entries["twin_b/_p.py"] == "b's"
    assert entries["twin_a/m.py"] == entries["twin_b/m.py"] == "in both twins"
    assert "twin_b/_only.py" not in entries and "other/gone.py" not in entries


def test_negative_control_a_listed_module_that_does_not_exist(tree: Path) -> None:
    """A module listed but deleted from the tree is named."""
    (tree / "pkg" / "a.py").unlink()
    assert synthetic(tree) == ["listed but absent: pkg/a.py"]


def test_negative_control_a_listed_twin_module_that_does_not_exist(tree: Path) -> None:
    """A table row naming a module one twin lacks is named for that twin."""
    (tree / "twin_b" / "_p.py").unlink()
    assert synthetic(tree) == ["listed but absent: twin_b/_p.py"]


def test_negative_control_an_unlisted_module(tree: Path) -> None:
    """A module in the tree that the page leaves out is named, also in a twin and in a new package."""
    (tree / "pkg" / "c.py").write_text("")
    (tree / "twin_b" / "_only.py").write_text("")
    (tree / "pkg" / "new").mkdir()
    (tree / "pkg" / "new" / "d.py").write_text("")
    assert synthetic(tree) == [f"present but unlisted: {p}"
                               for p in ("pkg/c.py", "pkg/new/", "pkg/new/d.py", "twin_b/_only.py")]


def test_negative_control_an_init_listed_as_a_module(tree: Path) -> None:
    """`__init__.py` is its package's line: listing it separately is flagged."""
    doc = SYNTHETIC_DOC.replace("  a.py ", "  __init__.py         the package again\n  a.py ")
    assert synthetic(tree, doc) == ["listed as a module, but __init__.py is its package's line: pkg/__init__.py"]


def test_negative_control_a_missing_purpose_and_a_duplicate(tree: Path) -> None:
    """An entry without its one-line purpose, and an entry listed twice, are flagged."""
    doc = SYNTHETIC_DOC.replace("  a.py                a module", "  a.py\n  a.py                again")
    assert synthetic(tree, doc) == ["listed twice: pkg/a.py", "listed without a purpose: pkg/a.py"]


def test_negative_control_a_listed_data_directory_must_exist(tree: Path) -> None:
    """A data directory may be listed without Python below it, but not once it is gone."""
    (tree / "pkg" / "assets" / "data.csv").unlink()
    (tree / "pkg" / "assets").rmdir()
    assert synthetic(tree) == ["listed but absent: pkg/assets/"]


@pytest.mark.parametrize("broken", [
    SYNTHETIC_DOC.replace("  a.py ", " a.py  "),
    SYNTHETIC_DOC.replace("a module\n", "a module\n    x.py  under a module\n"),
    SYNTHETIC_DOC.replace("pkg/ ", "  pkg/ "),
    SYNTHETIC_DOC.replace("| `_only` |", "| `_only` (in progress) |"),
    SYNTHETIC_DOC.replace("| `_only` | twin_a |", "| `_only` | twin_c |"),
])
def test_negative_control_a_malformed_page_is_an_error(broken: str) -> None:
    """Odd indentation, nesting under a module or nothing, a stale note in a module cell, an unknown side: errors."""
    with pytest.raises(DocFormatError):
        listed(broken, SYNTHETIC_TOPS, SYNTHETIC_TWINS)
