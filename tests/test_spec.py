"""The config spec: strict loading, one-line errors naming the field, overrides, round trips."""

from __future__ import annotations

import math
import subprocess
import sys
import tomllib
from typing import Any

import pytest

from conformance.config import (
    Config,
    apply_overrides,
    dump_config,
    load_config,
    parse_value,
)
from conformance.errors import ConfigError

BAD_VALUES: list[Any] = ["text", "1e-3", -1, -1.5, 1e30, math.nan, math.inf, True, [1, 2, 3], {"x": 1}, 0]


def _leaves(data: dict, path: tuple = ()) -> list[tuple]:
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out += _leaves(value, (*path, key))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for i, item in enumerate(value):
                out += _leaves(item, (*path, key, i))
        else:
            out.append((*path, key))
    return out


def _set(data: dict, path: tuple, value: Any) -> dict:
    import copy

    data = copy.deepcopy(data)
    node = data
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return data


def _dotted(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))


BASE = tomllib.loads(dump_config(load_config(None, ['optimizer.groups=[{params=["*.bias"], lr=0.5}]'])))
LEAVES = _leaves(BASE)


@pytest.mark.parametrize("path", LEAVES, ids=_dotted)
def test_every_leaf_rejects_bad_values_with_one_line(path: tuple) -> None:
    rejected = 0
    for bad in BAD_VALUES:
        try:
            load_config(_set(BASE, path, bad))
        except ConfigError as exc:
            text = str(exc)
            rejected += 1
            assert "\n" not in text
            section = path[0]
            assert text.startswith(section), f"{_dotted(path)}={bad!r}: {text}"
        # any other exception type propagates and fails the test
    assert rejected >= len(BAD_VALUES) - 4, f"{_dotted(path)} accepted too many bad values"


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match=r"^optimizer\.lrr is not a known key \(did you mean 'lr'\?\)$"):
        load_config({"optimizer": {"lrr": 0.1}})
    with pytest.raises(ConfigError, match=r"^optimiser is not a known key \(did you mean 'optimizer'\?\)$"):
        load_config({"optimiser": {}})


def test_out_of_range_names_field_and_value() -> None:
    with pytest.raises(ConfigError, match=r"^optimizer\.betas\[1\] must be in \[0, 1\); received 1\.5$"):
        load_config({"optimizer": {"name": "adam", "betas": [0.9, 1.5]}})


def test_strict_types_no_coercion() -> None:
    with pytest.raises(ConfigError, match=r"optimizer\.lr must be a valid number; received '1e-3'"):
        load_config({"optimizer": {"lr": "1e-3"}})
    with pytest.raises(ConfigError, match=r"run\.epochs must be a valid integer"):
        load_config({"run": {"epochs": 2.0}})


def test_option_for_another_variant_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"loss\.delta is only used when name is huber"):
        load_config({"loss": {"name": "mse", "delta": 2.0}})


def test_overrides_parse_toml_values() -> None:
    assert parse_value("1e-3") == 1e-3
    assert parse_value("[0.9, 0.99]") == [0.9, 0.99]
    assert parse_value("adam") == "adam" and parse_value('"adam"') == "adam"
    data = apply_overrides({}, ["optimizer.lr=0.5", "optimizer.name=sgd", "loss.name=mse"])
    assert data == {"optimizer": {"lr": 0.5, "name": "sgd"}, "loss": {"name": "mse"}}
    cfg = load_config(None, ["optimizer.groups=[{params=['*.bias'], lr=0.1}]", "optimizer.groups[0].lr=0.2"])
    assert cfg.optimizer.groups[0].lr == 0.2
    for bad in ["optimizer", "lr=1", "optimizer.groups[3].lr=1", "optimizer.lr=[1,"]:
        with pytest.raises(ConfigError):
            load_config(None, [bad])


def test_dump_round_trips_and_is_complete() -> None:
    cfg = load_config(None, ["optimizer.groups=[{params=['*.bias'], lr=0.1}]", "run.seed=7"])
    text = dump_config(cfg)
    again = load_config(tomllib.loads(text))
    assert again == cfg
    assert dump_config(again) == text
    for section in Config.model_fields:
        assert f"[{section}]" in text


def test_config_file_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[optimizer]\nlr = 0.1\nlr = 0.2\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"missing\.toml: no such file"):
        load_config(tmp_path / "missing.toml")
    typo = tmp_path / "typo.toml"
    typo.write_text("[optimizer]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match=r"typo\.toml: optimizer\.learning_rate is not a known key"):
        load_config(typo)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "optimizer.lrr=0.1"], "optimizer.lrr is not a known key (did you mean 'lr'?)"),
        (["--set", "optimizer.betas=[0.9, 1.5]"], "optimizer.betas[1] must be in [0, 1); received 1.5"),
    ],
)
def test_cli_exits_2_with_one_line_no_traceback(args: list[str], needle: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "conformance", "config", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"twinstep: error: {needle}"
    assert "Traceback" not in proc.stderr and proc.stdout == ""
