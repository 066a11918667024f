"""The three backends the harness runs: ref_torch, ref_jax and the NumPy float64 oracle.

They are twins: each exposes the same module and function names (`losses.loss_value_and_grad`,
`optimizers.run_trajectory`, ...), taking and returning NumPy arrays. A kind plugin asks a backend
for a function by name; a backend that lacks it makes the case fail with a message saying so.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from conformance.errors import UnsupportedError

PACKAGES: dict[str, str] = {"torch": "ref_torch", "jax": "ref_jax", "oracle": "conformance.oracle"}


@dataclass(frozen=True)
class Backend:
    name: str

    @property
    def package(self) -> str:
        return PACKAGES[self.name]

    def module(self, name: str) -> ModuleType:
        full = f"{self.package}.{name}"
        try:
            return importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name in (full, self.package):
                raise UnsupportedError(f"backend {self.name} has no module {full} yet") from None
            raise

    def function(self, module: str, name: str) -> Callable[..., Any]:
        """`module.name` of this backend, or UnsupportedError saying it is not implemented yet."""
        fn = getattr(self.module(module), name, None)
        if fn is None:
            raise UnsupportedError(f"backend {self.name} does not implement {module}.{name} yet")
        return fn

    def context(self) -> contextlib.AbstractContextManager:
        """The backend's numerics context (e.g. JAX's 64-bit mode) for running a case."""
        try:
            make = getattr(self.module("backend"), "context", None)
        except UnsupportedError:
            make = None
        return make() if make is not None else contextlib.nullcontext()


def get_backends(names: str | list[str]) -> list[Backend]:
    if isinstance(names, str):
        names = list(PACKAGES) if names == "all" else [names]
    return [Backend(n) for n in names]


@dataclass(frozen=True)
class PatchedBackend(Backend):
    """A backend with some functions replaced: negative controls plant a known bug this way and
    check that the harness catches it (e.g. softmax applied before cross-entropy)."""

    patches: tuple[tuple[str, str, Callable[..., Any]], ...] = ()
    label: str = "mutant"

    def function(self, module: str, name: str) -> Callable[..., Any]:
        for mod, fn_name, replacement in self.patches:
            if (mod, fn_name) == (module, name):
                return replacement
        return super().function(module, name)
