"""Conformance case files (docs/contract.md §3): loading and strict validation.

A case is one TOML file: a header (id, kind, source, dtype, backends), the spec tables it needs
(same schema as a training config), `[inputs]`, `[expected]` and an optional `[tolerance]`.
Every problem is reported as one `CaseError` line naming the file and the key.
"""

from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import ConfigDict, Field

from conformance.config import SECTIONS, Config, load_toml
from conformance.config.base import NonNegative, Section, validate
from conformance.errors import CaseError, ConfigError
from conformance.rules.tolerance import default_tolerance

KINDS: tuple[str, ...] = ("loss", "schedule", "optimizer", "clip", "accumulate", "loss_scale", "train")
BACKENDS: tuple[str, ...] = ("torch", "jax", "oracle")
CASE_DTYPES: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")

CASES_DIR = Path(__file__).resolve().parent.parent / "cases"


class Tolerance(Section):
    """`[tolerance]`: the case's own atol and rtol; `why` states the derived bound that lets a pass
    rest on atol at values below it (the harness refuses such a pass without one)."""

    atol: NonNegative
    rtol: NonNegative = 0.0
    why: str = ""


class ExpectedError(Section):
    """`[expected]` of a case that must fail: the error class and a substring of its message."""

    error: str
    message: str = ""


class CaseHeader(Section):
    """The keys every case has; spec tables, inputs and expected are checked per kind."""

    model_config = ConfigDict(extra="allow")  # the section tables; checked against SECTIONS below

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*(/[A-Za-z0-9_.\-=\[\]]+)+$")
    kind: Literal["loss", "schedule", "optimizer", "clip", "accumulate", "loss_scale", "train"]
    source: str = Field(min_length=1)
    description: str = ""
    dtype: Literal["float64", "float32", "bfloat16", "float16"] = "float64"
    backends: list[Literal["torch", "jax", "oracle"]] = Field(default_factory=lambda: list(BACKENDS))
    tolerance: Tolerance | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    expected: dict[str, Any]


@dataclass(frozen=True)
class Case:
    """A validated case. `sections` holds the spec tables present in the file, validated."""

    id: str
    kind: str
    source: str
    path: Path
    dtype: str
    backends: tuple[str, ...]
    sections: dict[str, Any]
    inputs: Any
    expected: Any
    raw_expected: dict[str, Any]
    atol: float
    rtol: float
    description: str = ""
    config: Config | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    tolerance_why: str = ""  # [tolerance] why: the bound that lets a pass rest on atol below it

    @property
    def expects_error(self) -> bool:
        return isinstance(self.expected, ExpectedError)


def kind_module(kind: str) -> ModuleType | None:
    """The harness plugin for a case kind, or None if this harness has none yet."""
    name = f"conformance.harness.kinds.{kind}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def used_sections(module: ModuleType | None, kind: str) -> tuple[str, ...] | None:
    """The config tables a kind reads: its USED_SECTIONS, else its REQUIRED_SECTIONS (None: no plugin)."""
    if module is None:
        return None
    return tuple(getattr(module, "USED_SECTIONS", getattr(module, "REQUIRED_SECTIONS", ())))


def parse_case(data: dict[str, Any], path: Path) -> Case:
    """Validate a parsed case file. Raises CaseError('<file>: <key> <problem>')."""
    where = f"{path}: "
    header = _validate(CaseHeader, data, where)
    extras = dict(header.model_extra or {})
    module = kind_module(header.kind)
    sections: dict[str, Any] = {}
    config: Config | None = None
    if header.kind == "train":
        config = _train_config(extras, where)
        sections = {name: getattr(config, name) for name in SECTIONS}
    else:
        used = used_sections(module, header.kind)
        for name, table in extras.items():
            if name not in SECTIONS:
                known = ", ".join(["id", "kind", "source", "description", "dtype", "backends",
                                   "inputs", "expected", "tolerance", *SECTIONS])
                raise CaseError(f"{where}{name} is not a known key; known keys: {known}")
            if used is not None and name not in used:
                reads = ", ".join(f"[{n}]" for n in used) or "no config table"
                raise CaseError(f"{where}[{name}] is not read by kind = {header.kind!r} (it reads {reads}); "
                                "remove the table or use a kind that reads it")
            sections[name] = _validate(SECTIONS[name], table, where, prefix=name)
    raw_expected = header.expected
    if "error" in raw_expected:
        expected: Any = _validate(ExpectedError, raw_expected, where, prefix="expected")
        inputs: Any = header.inputs
        if module is not None and hasattr(module, "Inputs"):
            inputs = _validate(module.Inputs, header.inputs, where, prefix="inputs")
    elif module is None:
        inputs, expected = header.inputs, raw_expected
    else:
        for name in getattr(module, "REQUIRED_SECTIONS", ()):
            if name not in sections:
                raise CaseError(f"{where}[{name}] is required for kind = {header.kind!r}")
        inputs = _validate(module.Inputs, header.inputs, where, prefix="inputs")
        expected = _validate(module.Expected, raw_expected, where, prefix="expected")
    if header.tolerance is not None:
        atol, rtol, why = header.tolerance.atol, header.tolerance.rtol, header.tolerance.why.strip()
    else:
        (atol, rtol), why = default_tolerance(header.dtype), ""
    case = Case(
        id=header.id, kind=header.kind, source=header.source, path=path, dtype=header.dtype,
        backends=tuple(dict.fromkeys(header.backends)), sections=sections, inputs=inputs,
        expected=expected, raw_expected=raw_expected, atol=atol, rtol=rtol,
        description=header.description, config=config, tolerance_why=why,
    )
    check = getattr(module, "check_case", None)
    if check is not None and not case.expects_error:
        try:
            check(case)
        except (CaseError, ConfigError, ValueError) as exc:
            raise CaseError(f"{where}{exc}") from None
    return case


def _train_config(extras: dict[str, Any], where: str) -> Config:
    try:
        return validate(Config, extras)
    except ConfigError as exc:
        raise CaseError(f"{where}{exc}") from None


def _validate(model: type, data: Any, where: str, prefix: str = "") -> Any:
    try:
        return validate(model, data, prefix=prefix, error=CaseError)
    except CaseError as exc:
        raise CaseError(f"{where}{exc}") from None


def load_case(path: str | Path) -> Case:
    path = Path(path)
    return parse_case(load_toml(path, error=CaseError), path)


def find_case_files(dirs: list[str | Path]) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        d = Path(d)
        if d.is_file():
            files.append(d)
        elif d.is_dir():
            files.extend(sorted(p for p in d.rglob("*.toml") if p.is_file()))
        else:
            raise CaseError(f"{d}: no such case file or directory")
    return files


@dataclass(frozen=True)
class BrokenCase:
    """A case file that could not be loaded: the file, the key at fault and why (one line)."""

    path: Path
    key: str
    reason: str
    id: str | None = None  # the file's id, when its header could be read
    kind: str | None = None

    @property
    def message(self) -> str:
        return f"{self.path}: {self.key} {self.reason}"


_FILE_PROBLEMS = ("invalid TOML", "not UTF-8", "no such file", "cannot read")


def broken_case(path: Path, exc: CaseError, data: dict[str, Any] | None) -> BrokenCase:
    """Split a CaseError '<file>: <key> <reason>' into its parts."""
    text = str(exc)
    rest = text[len(f"{path}: "):] if text.startswith(f"{path}: ") else text
    if rest.startswith(_FILE_PROBLEMS) or " bytes is too large" in rest:
        key, reason = "(file)", rest
    else:
        key, _, reason = rest.partition(" ")
    data = data or {}
    case_id = data.get("id") if isinstance(data.get("id"), str) else None
    kind = data.get("kind") if data.get("kind") in KINDS else None
    return BrokenCase(path, key.rstrip(":"), reason, case_id, kind)


def collect_cases(dirs: list[str | Path] | None = None, only: list[str] | None = None
                  ) -> tuple[list[Case], list[BrokenCase]]:
    """The cases under `dirs` (default: the bundled suite) whose id matches a glob of `only`, sorted
    by id, and the files that could not be loaded (one BrokenCase each; a reused id is one too).
    A broken file whose id is readable is kept only if that id matches `only`."""
    files = find_case_files(list(dirs) if dirs else [CASES_DIR])

    def wanted(case_id: str | None) -> bool:
        return not only or case_id is None or any(fnmatch.fnmatchcase(case_id, g) for g in only)

    cases: dict[str, Case] = {}
    broken: list[BrokenCase] = []
    for path in files:
        data: dict[str, Any] | None = None
        try:
            data = load_toml(path, error=CaseError)
            case = parse_case(data, path)
            if case.id in cases:
                raise CaseError(f"{path}: id {case.id!r} is already used by {cases[case.id].path}")
        except CaseError as exc:
            problem = broken_case(path, exc, data)
            if wanted(problem.id):
                broken.append(problem)
            continue
        cases[case.id] = case
    selected = [c for c in cases.values() if wanted(c.id)]
    return sorted(selected, key=lambda c: c.id), broken


def load_cases(dirs: list[str | Path] | None = None, only: list[str] | None = None) -> list[Case]:
    """All cases under `dirs` (default: the bundled suite), filtered by id globs, sorted by id.
    Raises CaseError for the first file that cannot be loaded (collect_cases keeps going)."""
    cases, broken = collect_cases(dirs, only)
    if broken:
        raise CaseError(broken[0].message)
    return cases
