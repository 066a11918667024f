"""The training config: every section of docs/contract.md §5, strictly validated.

    config = load_config("configs/seed_binary.toml", overrides=["optimizer.lr=1e-3"])
    text = dump_config(config)          # every default filled in; loads back to the same Config
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from conformance import tomlio
from conformance.config.accumulation import AccumulationSpec
from conformance.config.base import Section, check_plain, validate
from conformance.config.checkpoint import CheckpointSpec
from conformance.config.clip import ClipSpec
from conformance.config.data import USED_BY as DATA_USED_BY, DataSpec
from conformance.config.ema import EmaSpec
from conformance.config.loss import USED_BY as LOSS_USED_BY, LossSpec
from conformance.config.model import USED_BY as MODEL_USED_BY, ModelSpec
from conformance.config.optimizer import USED_BY as OPTIMIZER_USED_BY, GroupSpec, OptimizerSpec
from conformance.config.precision import PrecisionSpec
from conformance.config.representable import CAST_SECTIONS, unrepresentable
from conformance.config.run import RunSpec
from conformance.config.schedule import USED_BY as SCHEDULE_USED_BY, ScheduleSpec
from conformance.errors import ConfigError
from conformance.files import read_regular

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
        reason = unrepresentable({name: getattr(self, name).model_dump(mode="python") for name in CAST_SECTIONS},
                                 self.precision.param_dtype)
        if reason is not None:
            raise ValueError(reason)
        return self


SECTIONS: dict[str, type[Section]] = {
    name: field.annotation for name, field in Config.model_fields.items()  # type: ignore[misc]
}


def load_toml(path: str | Path, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """Read a TOML file into a dict; one clear `error` line for a missing, huge, non-regular (a FIFO,
    a device: refused at once, never read) or malformed file, or one nested too deeply."""
    raw = read_regular(path, MAX_CONFIG_BYTES, what="config", error=error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None
    return tomlio.parse(text, str(path), error)


_BARE_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/*]*$")


def parse_value(text: str) -> Any:
    """Parse an override VALUE as ONE TOML value (`1e-3`, `[0.9, 0.99]`, `true`, `"adam"`); a bare
    word that is not TOML (`adam`) is taken as a string. A line break or anything after the value
    (`1e-3\n[run]\nseed = 5`) is refused, never parsed as more config."""
    if "\n" in text or "\r" in text:
        raise ConfigError(f"--set value {text!r} spans several lines; --set takes exactly one key=value")
    try:
        parsed = tomlio.parse(f"v = {text}", error=ConfigError)
    except ConfigError:
        if _BARE_WORD.match(text.strip()):
            return text.strip()
        raise ConfigError(f"--set value {text!r} is not one valid TOML value (quote strings: '\"text\"')") from None
    if set(parsed) != {"v"}:
        raise ConfigError(f"--set value {text!r} holds more than one value; --set takes exactly one key=value")
    return parsed["v"]


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


def _index(node: Any, index: int, key: str, upto: str) -> None:
    # Explain an index --set cannot follow: no list there in the config (its default is not
    # spelled out), or a list too short.
    if not isinstance(node, list) or not node:
        raise ConfigError(f"--set {key}: the config does not spell out {upto} as a list, so it has no element "
                          f"{index} to change; set the whole value instead (--set '{upto}=[...]')")
    if index >= len(node):
        raise ConfigError(f"--set {key}: {upto} has {len(node)} element(s); index {index} is out of range")


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `section.key=VALUE` override applied."""
    out: dict[str, Any] = copy.deepcopy(dict(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} must be section.key=VALUE")
        key, _, text = item.partition("=")
        key = key.strip()
        path = _parse_key(key)
        node: Any = out
        upto = ""
        for i, part in enumerate(path[:-1]):
            nxt = path[i + 1]
            if isinstance(part, int):
                _index(node, part, key, upto)
                node = node[part]
                upto += f"[{part}]"
            else:
                if not isinstance(node, dict):
                    raise ConfigError(f"--set {key}: {upto} is a value, not a table")
                if part not in node:
                    node[part] = [] if isinstance(nxt, int) else {}
                node = node[part]
                upto += f".{part}" if upto else part
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--set {key}: {upto} is a value, not a table or a list")
        last = path[-1]
        value = parse_value(text)
        if isinstance(last, int):
            _index(node, last, key, upto)
        elif not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {upto} is a list, not a table")
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
    try:
        check_plain(data)  # before anything recurses into it (a dict from Python may nest 5000 deep)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None
    data = apply_overrides(data, overrides)
    try:
        check_plain(data)
        return validate(Config, data)
    except ConfigError as exc:
        raise ConfigError(f"{where}{exc}") from None


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_strip_none(v) for v in value]
    return value


def _read_fields(table: dict[str, Any], used_by: Mapping[str, Iterable[str]], name: str | None = None) -> dict[str, Any]:
    """`table` without the fields its component (`name`, else table["name"]) never reads."""
    chosen = name if name is not None else table.get("name")
    return {k: v for k, v in table.items() if k not in used_by or chosen in tuple(used_by[k])}


def _only_read(data: dict[str, Any]) -> dict[str, Any]:
    """The dumped config without the fields the chosen model, data set, loss, optimizer (its groups
    and fallback too) and schedule (its parts too) never read: each such field holds its default
    (Section.reject_unused refuses anything else), so the result loads back to the same config."""
    out = dict(data)
    for section, used_by in (("model", MODEL_USED_BY), ("data", DATA_USED_BY), ("loss", LOSS_USED_BY)):
        out[section] = _read_fields(out[section], used_by)
    opt = _read_fields(out["optimizer"], OPTIMIZER_USED_BY)
    if "groups" in opt:
        opt["groups"] = [_read_fields(g, OPTIMIZER_USED_BY, opt["name"]) for g in opt["groups"]]
    if "fallback" in opt:
        opt["fallback"] = _read_fields(opt["fallback"], OPTIMIZER_USED_BY)
    out["optimizer"] = opt

    def parts(table: dict[str, Any]) -> dict[str, Any]:
        table = _read_fields(table, SCHEDULE_USED_BY)
        if "schedulers" in table:
            table["schedulers"] = [parts(p) for p in table["schedulers"]]
        return table

    out["schedule"] = parts(out["schedule"])
    return out


def dump_config(config: Config, read_only: bool = False) -> str:
    """The resolved config as TOML, every default filled in (None fields are left out: absent
    means None when loaded back). `read_only`: without the fields the chosen components never
    read (what `twinstep config` prints; the run directory's config.toml keeps every field)."""
    data = _strip_none(config.model_dump(mode="python"))
    return tomlio.dumps(_only_read(data) if read_only else data)
