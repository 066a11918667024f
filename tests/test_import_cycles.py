"""No import circle among twinstep's modules (conformance, ref_torch, ref_jax, natives), lazy imports
included: a circle makes a module's meaning depend on which side is imported first, and a lazy import
inside a function is how one hides. `from pkg import sub` is an edge to the module `pkg.sub` when
`sub` is one (Python runs `pkg/__init__` first either way; that is not a circle), else to `pkg`."""

from __future__ import annotations

from pathlib import Path

from test_architecture import ROOT, Import, _write, import_graph


def module_edges(graph: list[Import]) -> dict[str, set[str]]:
    """Module → the modules of the same tree it imports (names that are not modules dropped)."""
    modules = {i.module for i in graph}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for imp in graph:
        if imp.target in modules and imp.target != imp.module:
            edges[imp.module].add(imp.target)
    # `from pkg import sub` also yields an edge to pkg: keep it only when no named submodule explains it
    for imp in graph:
        if imp.target in modules and any(i.module == imp.module and i.line == imp.line
                                         and i.target.startswith(imp.target + ".") and i.target in modules
                                         for i in graph):
            edges[imp.module].discard(imp.target)
    return edges


def circles(graph: list[Import]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    edges = module_edges(graph)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                part.append(w)
            if part:
                found.append(sorted([v, *part]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circle() -> None:
    graph = import_graph(ROOT)
    assert len({i.module for i in graph}) > 200
    assert circles(graph) == []


def test_negative_control_a_lazy_circle_is_seen(tmp_path: Path) -> None:
    _write(tmp_path, {
        "conformance/__init__.py": "", "conformance/data/__init__.py": "from conformance.data import splits\n",
        "conformance/data/splits.py": "X = 1\n",
        "conformance/data/datasets.py": "from conformance.data.splits import X\n\ndef load():\n"
                                        "    from conformance.data.arrays import load_arrays\n",
        "conformance/data/arrays.py": "from conformance.data import splits\n\ndef load_arrays():\n    pass\n",
    })
    assert circles(import_graph(tmp_path)) == []  # a package importing its submodule is no circle
    _write(tmp_path, {"conformance/data/arrays.py": "from conformance.data.datasets import X\n"})
    assert circles(import_graph(tmp_path)) == [["conformance.data.arrays", "conformance.data.datasets"]]
