"""The torch optimizer code a `--to torch` snippet carries where torch.optim has no class for the
spec's semantics (Lion; optax's eps placements and AMSGrad variants; decoupled weight decay on the
classes without it; Muon in float or with a fallback; NAdam's float64 mu_product): the very code
twinstep's torch twin runs, copied out of ref_torch's module files, so the two cannot diverge.

`carried(names)` reads the source *text* of ref_torch's modules (located with find_spec, which runs
nothing: ref_torch and torch stay unimported) and returns each named top-level class or function
verbatim, decorators included, preceded by every top-level definition of the same module it uses
(a base class, a helper function, a type alias), recursively, through ref_torch's own imports too.
The imports those definitions need from outside ref_torch (torch, typing) come back as import lines
for the snippet's header. The snippet stays standalone: it needs only torch.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import NamedTuple

TWIN = "ref_torch"
SNIPPET_IMPORTS = {"torch", "fnmatch", "math"}  # what every torch snippet imports already


class Module(NamedTuple):
    """One ref_torch module as text: its top-level definitions and the names it imports."""

    name: str  # e.g. "ref_torch._elementwise"
    text: str
    defined: dict[str, ast.stmt]  # top-level class, function or simple assignment, by name
    imported: dict[str, tuple[str, str | None]]  # bound name -> (module, name in it or None for `import m`)


class Carried(NamedTuple):
    """What a snippet carries: the names it imports from outside ref_torch (bound name -> (module,
    name in it or None)), then the source texts in dependency order."""

    imports: dict[str, tuple[str, str | None]]
    sources: list[str]


@functools.cache
def twin_dir() -> Path:
    """ref_torch's package directory (find_spec locates it without importing it)."""
    spec = importlib.util.find_spec(TWIN)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"the {TWIN} package (twinstep's torch twin) is not installed: its source is what "
                          f"a torch snippet carries")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def module(name: str) -> Module:
    """The parsed text of ref_torch module `name` ("ref_torch._muon")."""
    text = (twin_dir() / (name.split(".", 1)[1].replace(".", "/") + ".py")).read_text(encoding="utf-8")
    defined: dict[str, ast.stmt] = {}
    imported: dict[str, tuple[str, str | None]] = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            defined[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    defined[t.id] = node
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                imported[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                imported[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
    return Module(name, text, defined, imported)


def twin_modules() -> list[str]:
    """Every module of ref_torch (its package files, __init__ left out), by dotted name."""
    return sorted(f"{TWIN}.{p.stem}" for p in twin_dir().glob("*.py") if p.stem != "__init__")


def definer(name: str) -> str:
    """The one ref_torch module that defines top-level class or function `name`."""
    found = [m for m in twin_modules()
             if isinstance(module(m).defined.get(name), (ast.ClassDef, ast.FunctionDef))]
    if len(found) != 1:
        raise KeyError(f"{TWIN} defines {'no' if not found else 'more than one'} top-level class or function {name!r}"
                       + (f" ({', '.join(found)})" if found else ""))
    return found[0]


def text_of(mod: Module, name: str) -> str:
    """The source of a top-level definition, decorators included, without surrounding blank lines."""
    node = mod.defined[name]
    decorators = getattr(node, "decorator_list", [])
    first = min([node.lineno] + [d.lineno for d in decorators])
    return "\n".join(mod.text.splitlines()[first - 1:node.end_lineno])


def _used_names(node: ast.stmt) -> list[str]:
    """The names a definition reads, in source order (its own name left out; those the module
    neither defines nor imports, builtins and locals, are ignored by the caller)."""
    own = getattr(node, "name", None)
    seen = dict.fromkeys(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    return [n for n in seen if n != own]


def carried(names: list[str]) -> Carried:
    """The twin's top-level classes or functions `names` with everything they need (see the module
    docstring). A name two carried definitions bind with different text is an error."""
    sources: dict[str, str] = {}  # bound name -> source text, in dependency order
    imports: dict[str, tuple[str, str | None]] = {}

    def need(mod: Module, name: str, trail: tuple[str, ...]) -> None:
        if name in mod.defined:
            text = text_of(mod, name)
            if name in sources or name in trail:
                if name in sources and sources[name] != text:
                    raise ValueError(f"two definitions of {name!r} in {TWIN} would be carried into one snippet")
                return
            for used in _used_names(mod.defined[name]):
                need(mod, used, (*trail, name))
            sources[name] = text
        elif name in mod.imported:
            source_module, original = mod.imported[name]
            if source_module.split(".")[0] == TWIN:
                if original != name:
                    raise ValueError(f"{mod.name} binds {name!r} to another name of {source_module}: "
                                     f"not copyable verbatim")
                need(module(source_module), name, trail)
            elif source_module != "__future__":
                # one name from two modules (torch.optim and torch.optim.optimizer re-export the same
                # Optimizer): the same object only if it is the same name; the shorter path is kept
                held = imports.setdefault(name, (source_module, original))
                if held[1] != original:
                    raise ValueError(f"{name!r} would be imported as two different names into one snippet")
                if len(source_module) < len(held[0]):
                    imports[name] = (source_module, original)

    for name in names:
        need(module(definer(name)), name, ())
    return Carried(imports, list(sources.values()))


def import_lines(imports: dict[str, tuple[str, str | None]]) -> list[str]:
    """`import m` / `from m import a, b` lines for bound names (those every snippet has left out)."""
    plain = sorted({m for m, original in imports.values() if original is None} - SNIPPET_IMPORTS)
    froms: dict[str, list[str]] = {}
    for bound, (m, original) in imports.items():
        if original is not None:
            froms.setdefault(m, []).append(original if original == bound else f"{original} as {bound}")
    return [f"import {m}" for m in plain] + [f"from {m} import {', '.join(sorted(froms[m]))}" for m in sorted(froms)]


def source(name: str) -> str:
    """The verbatim source of ref_torch's top-level class or function `name` (no dependencies)."""
    return text_of(module(definer(name)), name)
