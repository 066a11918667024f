"""ref_torch and ref_jax are twins: same modules, same public names, signatures and docstrings."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import ref_jax
import ref_torch

# Names that are allowed to exist on one side only, each with the reason.
ONE_SIDED: dict[str, str] = {}


def _modules(pkg) -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))


def _public(module) -> dict[str, object]:
    return {
        name: obj
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and getattr(obj, "__module__", "") == module.__name__
    }


def test_same_modules() -> None:
    assert _modules(ref_torch) == _modules(ref_jax)


@pytest.mark.parametrize("name", _modules(ref_torch))
def test_same_public_surface(name: str) -> None:
    t = importlib.import_module(f"ref_torch.{name}")
    j = importlib.import_module(f"ref_jax.{name}")
    pt, pj = _public(t), _public(j)
    missing = {k for k in set(pt) ^ set(pj) if f"{name}.{k}" not in ONE_SIDED}
    assert not missing, f"names on one side only: {sorted(missing)}"
    for key in sorted(set(pt) & set(pj)):
        a, b = pt[key], pj[key]
        assert (a.__doc__ or "").strip() == (b.__doc__ or "").strip(), f"{name}.{key}: docstrings differ"
        if inspect.isfunction(a):
            assert str(inspect.signature(a)) == str(inspect.signature(b)), f"{name}.{key}: signatures differ"
