"""ref_torch and ref_jax are twins: the same public modules, each with the same module docstring and
`__all__`; every exported name the same kind of thing on both sides (a function with the same
signature and docstring; a class with the same docstring, NamedTuple fields and public methods;
a re-export of the very same neutral object); nothing public defined outside `__all__`."""

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

import ref_jax
import ref_torch

# The framework's own call hook: torch.nn.Module subclasses define forward, Flax NNX modules
# __call__ (a dunder, never compared), so forward is no public method of its own.
FRAMEWORK_HOOKS = frozenset({"forward"})


def _modules(pkg: ModuleType) -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def _defined(module: ModuleType) -> set[str]:
    """Public names the module's own source binds at the top level (functions, classes, constants)."""
    tree = ast.parse(Path(module.__file__).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def _origin(module: ModuleType, name: str, obj: Any) -> str:
    """Where an exported object comes from: this module, or the module it is re-exported from."""
    if name in _defined(module):
        return "here"
    return getattr(obj, "__module__", None) or "a value imported from elsewhere"


def _function(obj: Any) -> Any:
    return obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)


def _methods(cls: type) -> dict[str, Any]:
    """The class's own public methods and properties (inherited framework methods are not its own)."""
    return {k: _function(v) for k, v in vars(cls).items()
            if not k.startswith("_") and k not in FRAMEWORK_HOOKS
            and (inspect.isfunction(v) or isinstance(v, (property, classmethod, staticmethod)))}


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "")


def _compare_functions(where: str, a: Any, b: Any) -> list[str]:
    out = []
    if _doc(a) != _doc(b):
        out.append(f"{where}: docstrings differ")
    if str(inspect.signature(a)) != str(inspect.signature(b)):
        out.append(f"{where}: signatures differ: {inspect.signature(a)} vs {inspect.signature(b)}")
    return out


def _compare_classes(where: str, a: type, b: type) -> list[str]:
    out = []
    if _doc(a) != _doc(b):
        out.append(f"{where}: class docstrings differ")
    fields_a, fields_b = getattr(a, "_fields", None), getattr(b, "_fields", None)
    if fields_a != fields_b:
        out.append(f"{where}: NamedTuple fields differ: {fields_a} vs {fields_b}")
    elif fields_a is not None and a._field_defaults != b._field_defaults:
        out.append(f"{where}: NamedTuple defaults differ: {a._field_defaults} vs {b._field_defaults}")
    ma, mb = _methods(a), _methods(b)
    if set(ma) != set(mb):
        out.append(f"{where}: public methods differ: {sorted(set(ma) ^ set(mb))} on one side only")
    for name in sorted(set(ma) & set(mb)):
        out += _compare_functions(f"{where}.{name}", ma[name], mb[name])
    return out


def surface_differences(a: ModuleType, b: ModuleType) -> list[str]:
    """Every way two twin modules' public surfaces differ (empty: they are twins)."""
    out = []
    if _doc(a) != _doc(b):
        out.append("module docstrings differ")
    all_a, all_b = getattr(a, "__all__", None), getattr(b, "__all__", None)
    if all_a is None or all_b is None:
        return out + ["__all__ missing"]
    if list(all_a) != list(all_b):
        out.append(f"__all__ differs: {sorted(set(all_a) ^ set(all_b)) or 'the order'}")
    for m in (a, b):
        hidden = _defined(m) - set(m.__all__)
        if hidden:
            out.append(f"{m.__name__} defines public names outside __all__: {sorted(hidden)}")
        absent = [n for n in m.__all__ if not hasattr(m, n)]
        if absent:
            out.append(f"{m.__name__}.__all__ names what it does not have: {absent}")
    for name in [n for n in all_a if n in set(all_b) and hasattr(a, n) and hasattr(b, n)]:
        x, y = getattr(a, name), getattr(b, name)
        ox, oy = _origin(a, name, x), _origin(b, name, y)
        if ox != "here" or oy != "here":
            if x is not y:
                out.append(f"{name}: re-exports differ (from {ox} vs {oy})")
        elif inspect.isclass(x) and inspect.isclass(y):
            out += _compare_classes(name, x, y)
        elif inspect.isfunction(x) and inspect.isfunction(y):
            out += _compare_functions(name, x, y)
        elif callable(x) or callable(y) or type(x) is not type(y):
            out.append(f"{name}: different kinds of object ({type(x).__name__} vs {type(y).__name__})")
    return out


def test_same_modules() -> None:
    assert _modules(ref_torch) == _modules(ref_jax)


@pytest.mark.parametrize("name", _modules(ref_torch))
def test_same_public_surface(name: str) -> None:
    t = importlib.import_module(f"ref_torch.{name}")
    j = importlib.import_module(f"ref_jax.{name}")
    assert surface_differences(t, j) == []


def private_twin_imports(source: str) -> list[str]:
    """The ref_torch._* / ref_jax._* modules a source imports, at any depth (lazy imports
    included), or names to importlib.import_module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            found += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return sorted({m for m in found if m.split(".")[0] in ("ref_torch", "ref_jax")
                   and any(part.startswith("_") for part in m.split(".")[1:])})


def test_conformance_reaches_the_twins_only_through_public_modules() -> None:
    sources = sorted((Path(__file__).resolve().parents[1] / "conformance").rglob("*.py"))
    assert len(sources) > 50
    found = {str(p): private_twin_imports(p.read_text()) for p in sources}
    assert {p: m for p, m in found.items() if m} == {}
    # negative control: each way of reaching a private module is seen
    assert private_twin_imports("def f():\n    from ref_jax import _update\n") == ["ref_jax._update"]
    assert private_twin_imports("import ref_torch._update as u") == ["ref_torch._update"]
    assert private_twin_imports("importlib.import_module('ref_jax._window')") == ["ref_jax._window"]
    assert private_twin_imports("from ref_jax.update import run_updates") == []


# ---------------------------------------------------------------------------------------------
# negative control: a fake twin pair that differs in one aspect at a time is flagged every time
# ---------------------------------------------------------------------------------------------

BASE = '''
"""A fake twin module."""

from typing import Any, NamedTuple

from conformance.rules.windows import check_window

__all__ = ["Out", "Thing", "check_window", "run", "LIMIT"]

LIMIT = 3


class Out(NamedTuple):
    """Two numbers."""

    loss: Any
    count: Any = None


class Thing:
    """A thing."""

    def step(self, x: int) -> int:
        """One step."""
        return x

    def forward(self, x: int) -> int:
        return x


def run(x: int, y: int = 0) -> int:
    """Run it."""
    return x + y
'''

MUTANTS = {
    "module docstring": ('"""A fake twin module."""', '"""Another module."""'),
    "__all__": ('"run", "LIMIT"]', '"run"]'),
    "outside __all__": ("LIMIT = 3\n", "LIMIT = 3\nEXTRA = 4\n"),
    "names what it does not have": ('__all__ = ["Out",', '__all__ = ["Out", "missing",'),
    "re-export": ("from conformance.rules.windows import check_window",
                  "from conformance.rules.windows import check_window as _c\n\n\ndef check_window(): ..."),
    "NamedTuple fields": ("    count: Any = None", "    total: Any = None"),
    "NamedTuple defaults": ("    count: Any = None", "    count: Any = 0"),
    "public methods": ('        return x\n\n    def forward', '        return x\n\n    def reset(self) -> None:\n'
                       '        """Reset."""\n\n    def forward'),
    "method signature": ("def step(self, x: int)", "def step(self, x: int, y: int = 1)"),
    "class docstring": ('"""A thing."""', '"""A different thing."""'),
    "function signature": ("def run(x: int, y: int = 0)", "def run(x: int, y: int = 1)"),
    "function docstring": ('"""Run it."""', '"""Run it twice."""'),
    "kind": ("LIMIT = 3\n", "def LIMIT() -> int:\n    return 3\n"),
}


def _fake(tmp_path: Path, name: str, source: str) -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(f"twins_fake_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # NamedTuple looks its module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_comparison_flags_each_aspect(tmp_path: Path) -> None:
    base = _fake(tmp_path, "base", BASE)
    assert surface_differences(base, _fake(tmp_path, "same", BASE)) == []
    missed = []
    for aspect, (old, new) in MUTANTS.items():
        assert old in BASE, aspect
        mutant = _fake(tmp_path, aspect.replace(" ", "_").replace("-", "_"), BASE.replace(old, new))
        if not surface_differences(base, mutant) or not surface_differences(mutant, base):
            missed.append(aspect)
    assert missed == []


def _protocol_methods(cls: type) -> list[str]:
    return [k for k, v in vars(cls).items() if not k.startswith("_") and inspect.isfunction(v)]


def steps_differences(torch_steps: type, jax_steps: type, protocol: type) -> list[str]:
    """How the two trainers' framework steps differ from each other or from the driver's protocol:
    the same public methods in the same order, each with the protocol's signature and docstring."""
    out = _compare_classes("Steps", torch_steps, jax_steps)
    want = _protocol_methods(protocol)
    for cls in (torch_steps, jax_steps):
        if _protocol_methods(cls) != want:
            out.append(f"{cls.__module__}.Steps: methods {_protocol_methods(cls)}, the protocol's {want}")
        out += [f"{cls.__module__}.Steps.{n}: not the protocol's docstring" for n in want
                if n in vars(cls) and _doc(vars(cls)[n]) != _doc(vars(protocol)[n])]
    return out


def test_the_framework_steps_are_twins_of_the_drivers_protocol() -> None:
    from conformance.run.loop import Steps as Protocol
    t, j = importlib.import_module("ref_torch._steps"), importlib.import_module("ref_jax._steps")
    assert _doc(t) == _doc(j)
    assert steps_differences(t.Steps, j.Steps, Protocol) == []


def test_negative_control_steps_that_differ_are_seen() -> None:
    from conformance.run.loop import Steps as Protocol
    t, j = importlib.import_module("ref_torch._steps"), importlib.import_module("ref_jax._steps")
    silent = type("Steps", (), {**{k: v for k, v in vars(j.Steps).items() if k != "observe"},
                                "observe": lambda self, record: None})
    found = steps_differences(t.Steps, silent, Protocol)
    assert any("Steps.observe: docstrings differ" in f for f in found)
    assert any("observe: not the protocol's docstring" in f for f in found)
    reordered = type("Steps", (), {"save": j.Steps.save, **{k: v for k, v in vars(j.Steps).items() if k != "save"}})
    assert any("methods" in f for f in steps_differences(t.Steps, reordered, Protocol))
