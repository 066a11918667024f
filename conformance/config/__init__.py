"""The training config: every section of docs/contract.md §5, strictly validated.

    config = load_config("configs/seed_binary.toml", overrides=["optimizer.lr=1e-3"])
    text = dump_config(config)          # every default filled in; loads back to the same Config
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from conformance import tomlio
from conformance.config.accumulation import AccumulationSpec
from conformance.config.base import Section, validate
from conformance.config.checkpoint import CheckpointSpec
from conformance.config.clip import ClipSpec
from conformance.config.data import DataSpec
from conformance.config.ema import EmaSpec
from conformance.config.loss import LossSpec
from conformance.config.model import ModelSpec
from conformance.config.optimizer import GroupSpec, OptimizerSpec
from conformance.config.precision import PrecisionSpec
from conformance.config.run import RunSpec
from conformance.config.schedule import ScheduleSpec
from conformance.errors import ConfigError

__all__ = [
    "AccumulationSpec", "CheckpointSpec", "ClipSpec", "Config", "DataSpec", "EmaSpec", "GroupSpec", "LossSpec",
    "ModelSpec", "OptimizerSpec", "PrecisionSpec", "RunSpec", "ScheduleSpec", "SECTIONS",
    "apply_overrides", "dump_config", "load_config", "load_toml", "parse_value",
]

MAX_CONFIG_BYTES = 1 << 20  # a config is a page of text; anything bigger is a mistake


class Config(Section):
    """A whole training run. Every section has defaults: the empty config is the built-in default."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    loss: LossSpec = Field(default_factory=LossSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    clip: ClipSpec = Field(default_factory=ClipSpec)
    accumulation: AccumulationSpec = Field(default_factory=AccumulationSpec)
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    run: RunSpec = Field(default_factory=RunSpec)
    ema: EmaSpec = Field(default_factory=EmaSpec)

    @model_validator(mode="after")
    def _check_sections_together(self) -> "Config":
        try:
            self.accumulation.check_loss(self.loss.reduction)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self


SECTIONS: dict[str, type[Section]] = {
    name: field.annotation for name, field in Config.model_fields.items()  # type: ignore[misc]
}


def load_toml(path: str | Path, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """Read a TOML file into a dict; a missing, huge or malformed file is one clear error."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise error(f"{path}: {len(raw)} bytes is too large for a config (limit {MAX_CONFIG_BYTES})")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from None


_BARE_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/*]*$")


def parse_value(text: str) -> Any:
    """Parse an override VALUE as TOML (`1e-3`, `[0.9, 0.99]`, `true`, `"adam"`); a bare word
    that is not TOML (`adam`) is taken as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if _BARE_WORD.match(text.strip()):
            return text.strip()
        raise ConfigError(f"--set value {text!r} is not valid TOML (quote strings: '\"text\"')") from None


_KEY_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def _parse_key(key: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in key.split("."):
        match = _KEY_PART.match(piece)
        if not match:
            raise ConfigError(f"--set key {key!r} is not of the form section.key or section.key[i]")
        parts.append(match.group(1))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    if len(parts) < 2:
        raise ConfigError(f"--set key {key!r} must name a section and a key, e.g. optimizer.lr")
    return parts


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `section.key=VALUE` override applied."""
    out: dict[str, Any] = copy.deepcopy(dict(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} must be section.key=VALUE")
        key, _, text = item.partition("=")
        path = _parse_key(key.strip())
        node: Any = out
        for i, part in enumerate(path[:-1]):
            nxt = path[i + 1]
            if isinstance(part, int):
                if not isinstance(node, list) or part >= len(node):
                    raise ConfigError(f"--set {key}: index {part} is out of range")
                node = node[part]
                continue
            if part not in node:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--set {key}: {part!r} is a value, not a table")
        last = path[-1]
        value = parse_value(text)
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise ConfigError(f"--set {key}: index {last} is out of range")
            node[last] = value
        else:
            node[last] = value
    return out


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Iterable[str] = ()
) -> Config:
    """Load and validate a config from a TOML path, a dict, or None (the built-in default)."""
    if source is None:
        data: Mapping[str, Any] = {}
        where = ""
    elif isinstance(source, Mapping):
        data, where = source, ""
    else:
        data, where = load_toml(source), f"{source}: "
    data = apply_overrides(data, overrides)
    try:
        return validate(Config, data)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_strip_none(v) for v in value]
    return value


def dump_config(config: Config) -> str:
    """The resolved config as TOML, every default filled in (None fields are left out: absent
    means None when loaded back)."""
    return tomlio.dumps(_strip_none(config.model_dump(mode="python")))
