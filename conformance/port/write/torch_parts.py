"""The small torch optimizers a `--to torch` snippet needs where torch.optim has no class for the
spec's semantics (Lion; optax's eps placements and AMSGrad variants; Muon in float or with a
fallback; NAdam's float64 mu_product). Their source lives in templates/torch_optimizers.py, a real
module shipped as package data (linted and tested, never imported): `source(name)` copies one of
its top-level classes or functions out verbatim."""

from __future__ import annotations

import ast
from importlib import resources

TEMPLATE = ("templates", "torch_optimizers.py")


def template_text() -> str:
    """The whole template module as text."""
    return resources.files("conformance.port.write").joinpath(*TEMPLATE).read_text(encoding="utf-8")


def source(name: str) -> str:
    """The source text of the template's top-level class or function `name`, decorators included,
    without surrounding blank lines."""
    text = template_text()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "\n".join(text.splitlines()[first - 1:node.end_lineno])
    raise KeyError(f"templates/torch_optimizers.py defines no class or function {name!r}")
