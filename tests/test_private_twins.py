"""The twins' private modules are twins too: every private module name both ref_torch and ref_jax
have (`_update`, `_model`, ...) has the same module docstring and the same top-level definitions
in the same order, each with the same docstring and, for functions, methods and NamedTuples, the
same signature and fields; a same-named type means the same thing on both sides.

What is compared: the names a module defines at the top level without a leading underscore
(functions, classes, NamedTuples, constants and type aliases), because those are what the twin's
other modules call, so they are where a reader expects the twins to meet. `_helpers` are not
compared: they are how each framework carries out a shared job (torch's `_step` around
optimizer.step(), JAX's `_with_hyperparams` around an optax state), and comparing them would make the
allow-list a second copy of the code.

The exceptions are written down, each with its reason: `FRAMEWORK_ONLY` (a definition that exists on
one side only, because the other framework does that job differently or not at all) and
`OWN_SIGNATURES` (a shared definition whose parameters differ, because one framework needs an
argument the other does not). `NOT_YET_ALIGNED` lists the pairs that are not twins yet, with the
reason; it may only shrink, and a pair that becomes twins must leave it (a test says so).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support.private_twins import FRAMEWORK_ONLY, NOT_YET_ALIGNED, OWN_SIGNATURES, WAS_NOT_ALIGNED
from test_twins import _compare_classes, _compare_functions, _doc

import ref_jax
import ref_torch

def _private_modules(pkg: ModuleType) -> set[str]:
    return {m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("_")}


PAIRS = sorted(_private_modules(ref_torch) & _private_modules(ref_jax))


def definitions(module: ModuleType) -> list[str]:
    """The public names the module's own source defines at the top level, in source order."""
    names: list[str] = []
    for node in ast.parse(Path(module.__file__).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = [node.name]
        elif isinstance(node, ast.Assign):
            found = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = [node.target.id]
        else:
            found = []
        names += [n for n in found if not n.startswith("_") and n not in names]
    return names


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "class"
    return "function" if inspect.isfunction(obj) else "value"


def private_differences(a: ModuleType, b: ModuleType, only_a: frozenset[str] = frozenset(),
                        only_b: frozenset[str] = frozenset(), own_signatures: frozenset[str] = frozenset()
                        ) -> list[str]:
    """Every way two private twin modules differ (empty: they are twins). `only_a` / `only_b`: names
    allowed on one side only; `own_signatures`: names (or Class.method) whose signatures may differ."""
    out = []
    if _doc(a) != _doc(b):
        out.append("module docstrings differ")
    names_a = [n for n in definitions(a) if n not in only_a]
    names_b = [n for n in definitions(b) if n not in only_b]
    if names_a != names_b:
        one_side = sorted(set(names_a) ^ set(names_b))
        out.append(f"definitions differ: {one_side} on one side only" if one_side
                   else f"definitions in another order: {names_a} vs {names_b}")
    for name in [n for n in names_a if n in set(names_b)]:
        x, y = getattr(a, name), getattr(b, name)
        if _kind(x) != _kind(y):
            out.append(f"{name}: different kinds ({_kind(x)} vs {_kind(y)})")
            continue
        if _kind(x) == "class":
            found = _compare_classes(name, x, y)
        elif _kind(x) == "function":
            found = _compare_functions(name, x, y)
        else:
            found = []
        out += [f for f in found if not (f.split(":")[0] in own_signatures and "signatures differ" in f)]
    return out


def _allowed(pair: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    only_t = frozenset(n for (m, n) in FRAMEWORK_ONLY if m == f"ref_torch.{pair}")
    only_j = frozenset(n for (m, n) in FRAMEWORK_ONLY if m == f"ref_jax.{pair}")
    return only_t, only_j, frozenset(n for (p, n) in OWN_SIGNATURES if p == pair)


def _pair(pair: str) -> tuple[ModuleType, ModuleType]:
    return importlib.import_module(f"ref_torch.{pair}"), importlib.import_module(f"ref_jax.{pair}")


def _not_aligned() -> dict[str, str]:
    return dict(NOT_YET_ALIGNED)


@pytest.mark.parametrize("pair", [p for p in PAIRS if p not in _not_aligned()])
def test_private_modules_are_twins(pair: str) -> None:
    assert private_differences(*_pair(pair), *_allowed(pair)) == []


def test_not_yet_aligned_only_shrinks() -> None:
    listed = [name for name, _ in NOT_YET_ALIGNED]
    assert len(listed) == len(set(listed))
    assert set(listed) <= WAS_NOT_ALIGNED, "a pair may leave NOT_YET_ALIGNED, never join it"
    assert set(listed) <= set(PAIRS), "NOT_YET_ALIGNED names a module that is no longer a pair"
    assert all(reason.strip() for _, reason in NOT_YET_ALIGNED)
    now_twins = [p for p in listed if not private_differences(*_pair(p), *_allowed(p))]
    assert now_twins == [], "these pairs are twins now: take them out of NOT_YET_ALIGNED"


def test_every_pair_is_known() -> None:
    assert set(PAIRS) == WAS_NOT_ALIGNED  # a new private pair is compared from the start


def test_the_allow_lists_name_real_one_sided_definitions() -> None:
    stale = []
    for (module, name), reason in FRAMEWORK_ONLY.items():
        side, pair = module.split(".")
        other = "ref_jax" if side == "ref_torch" else "ref_torch"
        mine = definitions(importlib.import_module(module))
        if not reason.strip() or name not in mine or name in definitions(importlib.import_module(f"{other}.{pair}")):
            stale.append(f"{module}.{name}")
    for (pair, name), reason in OWN_SIGNATURES.items():
        t, j = _pair(pair)
        top = name.split(".")[0]
        if not reason.strip() or top not in definitions(t) or top not in definitions(j):
            stale.append(f"{pair}:{name}")
    assert stale == []


# ---------------------------------------------------------------------------------------------
# negative control: a synthetic pair of private modules that differ in one aspect at a time
# ---------------------------------------------------------------------------------------------

BASE = '''
"""A fake private module."""

from typing import Any, NamedTuple

LIMIT = 3


class Out(NamedTuple):
    """Two numbers."""

    loss: Any
    count: Any = None


def run(x: int, y: int = 0) -> int:
    """Run it."""
    return _helper(x) + y


def finish(x: int) -> int:
    """Finish it."""
    return x


def _helper(x: int) -> int:
    return x
'''

MUTANTS = {
    "renamed function": ("def run(x: int, y: int = 0)", "def run_all(x: int, y: int = 0)"),
    "order": ('def run(x: int, y: int = 0) -> int:\n    """Run it."""\n    return _helper(x) + y\n',
              'def _later() -> None:\n    pass\n'),
    "module docstring": ('"""A fake private module."""', '"""Another module."""'),
    "function docstring": ('"""Finish it."""', '"""Finish it twice."""'),
    "signature": ("def finish(x: int)", "def finish(x: int, y: int = 1)"),
    "NamedTuple fields": ("    count: Any = None", "    total: Any = None"),
    "kind": ("LIMIT = 3\n", "def LIMIT() -> int:\n    return 3\n"),
    "a definition more": ("LIMIT = 3\n", "LIMIT = 3\nEXTRA = 4\n"),
}


def _fake(tmp_path: Path, name: str, source: str) -> ModuleType:
    path = tmp_path / name / "_fake.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(f"private_twins_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuple looks its module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_negative_control_each_difference_is_flagged(tmp_path: Path) -> None:
    base = _fake(tmp_path, "base", BASE)
    assert private_differences(base, _fake(tmp_path, "same", BASE)) == []
    missed = []
    for aspect, (old, new) in MUTANTS.items():
        assert old in BASE, aspect
        source = BASE.replace(old, new)
        if aspect == "order":  # run moved after finish
            source += '\n\ndef run(x: int, y: int = 0) -> int:\n    """Run it."""\n    return _helper(x) + y\n'
        mutant = _fake(tmp_path, aspect.replace(" ", "_"), source)
        if not private_differences(base, mutant) or not private_differences(mutant, base):
            missed.append(aspect)
    assert missed == []
    renamed = private_differences(base, _fake(tmp_path, "renamed", BASE.replace("def run(", "def run_all(")))
    assert renamed == ["definitions differ: ['run', 'run_all'] on one side only"]


def test_negative_control_the_allow_lists_excuse_only_what_they_name(tmp_path: Path) -> None:
    base = _fake(tmp_path, "base", BASE)
    extra = _fake(tmp_path, "extra", BASE.replace("LIMIT = 3\n", "LIMIT = 3\nEXTRA = 4\n"))
    assert private_differences(base, extra, only_b=frozenset({"EXTRA"})) == []
    assert private_differences(base, extra, only_a=frozenset({"EXTRA"})) != []
    wider = _fake(tmp_path, "wider", BASE.replace("def finish(x: int)", "def finish(x: int, y: int = 1)"))
    assert private_differences(base, wider, own_signatures=frozenset({"finish"})) == []
    assert private_differences(base, wider, own_signatures=frozenset({"run"})) != []
    # a helper (leading underscore) is each side's own business
    assert private_differences(base, _fake(tmp_path, "helper", BASE.replace("_helper", "_other"))) == []
