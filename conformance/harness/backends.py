"""The backends the harness runs: the built-ins (ref_torch, ref_jax, the NumPy float64 oracle) and
any outside package that follows the same protocol (docs/backends.md).

A backend is a Python package with the built-ins' module and function names
(`losses.loss_value_and_grad`, `optimizers.run_trajectory`, ...), NumPy in and out. A kind plugin
asks a backend for a function by name; one the backend lacks is `MissingFunction` (an
UnsupportedError), which the runner reports as "unsupported: <module>.<function>".

`--backend NAME` resolves, in this order: a built-in name (the twins, the oracle, or one of the
frameworks' own built-ins in `natives/`: `torch-native`, `optax-native`, `keras`), a short name
registered by an installed distribution under the entry-point group `twinstep.backends`
(`name = "package.dotted.name"`), or the dotted name of any importable package. A name that resolves to nothing, or a package that
cannot be imported, is one BackendError line naming it and the import error.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from conformance.errors import BackendError, UnsupportedError

PACKAGES: dict[str, str] = {"torch": "ref_torch", "jax": "ref_jax", "oracle": "conformance.oracle"}
ALL: tuple[str, ...] = ("torch", "jax", "oracle")  # what `--backend all` (the default) runs
# the frameworks' own built-ins (natives/, docs/backends.md "Native backends"): built-in names too, but
# neither part of `all` nor twins (a case's `backends` list never selects them: every case is offered)
NATIVES: dict[str, str] = {"torch-native": "natives.torch_native", "optax-native": "natives.optax_native",
                           "keras": "natives.keras_backend"}
BUILTINS: dict[str, str] = {**PACKAGES, **NATIVES}
ENTRY_POINT_GROUP = "twinstep.backends"


class MissingFunction(UnsupportedError):
    """The harness asked a backend for a module or function it does not provide."""

    def __init__(self, backend: str, what: str) -> None:
        super().__init__(f"backend {backend} does not implement {what}")
        self.what = what


def require_parameters(backend: str, fn: Callable[..., Any], what: str, names: Any) -> None:
    """A protocol argument newer than a backend (`sample_weight`, `at`, `metrics`, `ema`) is passed
    only to the cases that need it; a backend function without that parameter is "unsupported" for
    those cases, naming the function and the argument, never a crash."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [n for n in names if n not in params]
    if missing:
        raise UnsupportedError(f"backend {backend}: {what} takes no {', '.join(missing)}")


@dataclass(frozen=True)
class Backend:
    """One backend: `name` as the user wrote it, `package` the package that implements it."""

    name: str
    package: str = ""  # "" = the built-in package of that name
    origin: str = "built-in"

    def __post_init__(self) -> None:
        if not self.package:
            if self.name not in BUILTINS:
                raise BackendError(f"backend {self.name!r} is not a built-in backend ({', '.join(BUILTINS)})")
            object.__setattr__(self, "package", BUILTINS[self.name])

    @property
    def builtin(self) -> bool:
        return BUILTINS.get(self.name) == self.package


    def module(self, name: str) -> ModuleType:
        full = f"{self.package}.{name}"
        try:
            return importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name in (full, self.package):
                raise MissingFunction(self.name, f"module {name}") from None
            raise

    def function(self, module: str, name: str) -> Callable[..., Any]:
        """`module.name` of this backend, or MissingFunction naming it."""
        try:
            mod = self.module(module)
        except MissingFunction:
            raise MissingFunction(self.name, f"{module}.{name}") from None
        fn = getattr(mod, name, None)
        if fn is None:
            raise MissingFunction(self.name, f"{module}.{name}")
        return fn

    def _optional(self, name: str) -> Callable[..., Any] | None:
        """`backend.<name>` of this backend's optional `backend` module, or None."""
        try:
            return getattr(self.module("backend"), name, None)
        except MissingFunction:
            return None

    def describe(self) -> dict[str, Any]:
        """What the backend's optional `backend.describe()` reports (versions); {} without one."""
        fn = self._optional("describe")
        return dict(fn()) if fn is not None else {}

    def release(self) -> None:
        """Drop what the backend keeps between cases (`backend.release()`, e.g. JAX's compiled
        programs); nothing without one. The harness calls it when a process's memory has grown
        (conformance.harness.runner.Releases)."""
        fn = self._optional("release")
        if fn is not None:
            fn()

    def share_compiled(self, directory: str) -> None:
        """Tell a worker process's backend where the run's workers keep compiled programs
        (`backend.share_compiled(directory)`, e.g. JAX's compilation cache); nothing without one."""
        fn = self._optional("share_compiled")
        if fn is not None:
            fn(directory)

    def context(self) -> contextlib.AbstractContextManager:
        """The backend's numerics context (`backend.context()`, e.g. JAX's 64-bit mode) for a case."""
        make = self._optional("context")
        return make() if make is not None else contextlib.nullcontext()


@dataclass(frozen=True)
class BackendInfo:
    """A backend `--list-backends` shows: its name, package and where the name comes from."""

    name: str
    package: str
    origin: str


def registered_backends() -> dict[str, BackendInfo]:
    """Short names registered by installed distributions under the `twinstep.backends` group."""
    from importlib.metadata import entry_points

    out: dict[str, BackendInfo] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        origin = f"entry point of {dist.name} {dist.version}" if dist is not None else "entry point"
        out.setdefault(ep.name, BackendInfo(ep.name, ep.module, origin))
    return out


def available_backends() -> list[BackendInfo]:
    """The built-ins, the native ones, then the registered names (a registered name equal to a
    built-in is shadowed)."""
    builtins = [BackendInfo(n, p, "built-in") for n, p in PACKAGES.items()]
    natives = [BackendInfo(n, p, "built-in: the framework's own built-ins") for n, p in NATIVES.items()]
    registered = [b for n, b in sorted(registered_backends().items()) if n not in BUILTINS]
    return builtins + natives + registered


def _import(name: str, package: str) -> None:
    try:
        importlib.import_module(package)
    except Exception as exc:  # any failure of an outside package's import is one line, not a traceback
        text = " ".join(str(exc).split())
        what = name if name == package else f"{name} ({package})"
        raise BackendError(f"backend {what} cannot be imported: {type(exc).__name__}: {text}") from None


def resolve_backend(name: str) -> Backend:
    """A built-in name, a registered short name, or the dotted name of an importable package."""
    if name in PACKAGES:
        return Backend(name)
    if name in NATIVES:  # imported now, so a missing framework (keras) is one line before any case
        _import(name, NATIVES[name])
        return Backend(name)
    registered = registered_backends()
    if name in registered:
        info = registered[name]
        _import(name, info.package)
        return Backend(name, info.package, info.origin)
    if not all(part.isidentifier() for part in name.split(".")):
        known = ", ".join([*BUILTINS, *sorted(registered)])
        raise BackendError(f"backend {name!r} is neither a backend name ({known}, all) nor the dotted name "
                           "of a Python package")
    _import(name, name)
    return Backend(name, name, "package")


def get_backends(names: str | list[str]) -> list[Backend]:
    """`all` (the built-ins), one name, or a list of names, resolved by resolve_backend."""
    if isinstance(names, str):
        names = list(ALL) if names == "all" else [names]
    out: list[Backend] = []
    for n in names:
        if n == "all":
            out.extend(Backend(a) for a in ALL)
        else:
            out.append(resolve_backend(n))
    return list(dict.fromkeys(out))


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
