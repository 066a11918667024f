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

# The values of BAD_VALUES that are legal for a field, with why; every other one must be refused.
LEGAL: list[tuple[tuple[str, ...], list[Any], str]] = [
    (("model.bias", "data.shuffle", "data.drop_last", "optimizer.maximize", "optimizer.amsgrad", "optimizer.eps_hat",
      "optimizer.cautious_weight_decay",
      "clip.error_if_nonfinite", "precision.allow_tf32", "checkpoint.at_end", "checkpoint.keep_best",
      "checkpoint.allow_fallback", "run.tensorboard", "run.compile", "run.deterministic", "run.sync_batchnorm"), [True],
     "a boolean (strict types still refuse 0 and 1.5; loss.log_target and clip.per_parameter refuse true "
     "too: they need name = kl_div and max_norm)"),
    (("model.dropout", "loss.label_smoothing"), [0], "in range: no dropout, no smoothing"),
    (("loss.z_loss",), [0, 1e30], "any finite value >= 0, as optimizer.lr (0 = no z-loss, the default; 1e30 is "
                                  "huge but finite)"),
    (("data.val_fraction",), [0], "in [0, 1): no validation split"),
    (("checkpoint.every", "run.eval_every"), [0], "0 = only at the end / never evaluate (documented)"),
    (("run.seed",), [0], "any non-negative seed"),
    (("ema.start",), [0], "from update 0 on (the default: the first update's weights start the EMA)"),
    (("optimizer.lr", "optimizer.groups[0].lr", "optimizer.weight_decay", "optimizer.eps", "optimizer.eps_root"),
     [0, 1e30], "any finite value >= 0, as torch.optim takes it (lr = 0 freezes the parameters, eps_root = 0 "
                "is its default); 1e30 is huge but finite"),
    (("clip.norm_type",), [1e30, math.inf], "any p > 0, or inf (the max-norm), as torch's clip_grad_norm_ (whose "
                                            "p = 1e30 norm overflows to inf, as the oracle's does)"),
    (("loss.ignore_index",), [-1, 0], "any integer: the class index to ignore (torch's default is -100)"),
    (("model.hidden",), [[1, 2, 3]], "three hidden layers of widths 1, 2 and 3"),
    (("run.inject_nonfinite",), [[1, 2, 3]], "strictly increasing update numbers"),
    (("data.name",), ["text"], "a data set name (the config is then refused, but for data.n_samples, which only "
                               "the synthetic data sets take)"),
]


def _legal(path: tuple) -> list[Any]:
    dotted = _dotted(path)
    out = []
    for fields, values, _why in LEGAL:
        if dotted in fields:
            out += values
    return out


def _is_in(value: Any, values: list[Any]) -> bool:
    # by type and value: 0 == False and 1e30 == 1e30 must not stand for each other
    return any(type(value) is type(v) and value == v for v in values)


@pytest.mark.parametrize("path", LEAVES, ids=_dotted)
def test_every_leaf_rejects_bad_values_with_one_line(path: tuple) -> None:
    field = _dotted(path)
    legal = _legal(path)
    for bad in BAD_VALUES:
        if _is_in(bad, legal):
            continue
        with pytest.raises(ConfigError) as info:  # any other exception type fails the test too
            load_config(_set(BASE, path, bad))
        text = str(info.value)
        assert "\n" not in text, f"{field}={bad!r}: {text!r}"
        assert text.startswith((f"{field} ", f"{field}[")), f"{field}={bad!r}: the error names another field: {text}"


@pytest.mark.parametrize("path", [p for p in LEAVES if _legal(p)], ids=_dotted)
def test_the_legal_exceptions_are_accepted(path: tuple) -> None:
    """LEGAL lists only values the schema really accepts (data.name = "text" aside: a legal name whose
    config is refused for another field), so it cannot hide a value the field starts refusing."""
    for value in _legal(path):
        if path == ("data", "name"):
            with pytest.raises(ConfigError, match=r"^data\.n_samples is only used when name is"):
                load_config(_set(BASE, path, value))
            assert load_config({"data": {"name": value}}).data.name == value
        else:
            load_config(_set(BASE, path, value))


def test_legal_names_real_fields() -> None:
    known = {_dotted(p) for p in LEAVES}
    assert {f for fields, _, _ in LEGAL for f in fields} <= known


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


@pytest.mark.parametrize("source", ["configs/gpt_tiny.toml", "configs/digits_mlp.toml", None, {
    "optimizer": {"name": "muon", "fallback": {"name": "adamw", "lr": 0.01}},
    "schedule": {"name": "sequential", "milestones": [3], "schedulers": [
        {"name": "linear", "start_factor": 0.5, "total_iters": 3}, {"name": "cosine", "t_max": 5}]}}])
def test_the_read_fields_dump_loads_back_to_the_same_config(source: Any) -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / source if isinstance(source, str) else source)
    short, full = dump_config(cfg, read_only=True), dump_config(cfg)
    assert load_config(tomllib.loads(short)) == cfg and len(short) < len(full)
    table = tomllib.loads(short)
    model, loss = table["model"], table["loss"]
    if model["name"] == "gpt":  # what a gpt never reads is left out; what it reads stays
        assert "hidden" not in model and "norm" not in model and "n_head" in model
    assert "delta" not in loss and "gamma" not in loss and "pos_weight" not in loss  # cross_entropy's only
    if isinstance(source, dict):
        parts = table["schedule"]["schedulers"]
        assert "t_max" not in parts[0] and "start_factor" not in parts[1] and "t_max" in parts[1]
        assert "betas" in table["optimizer"]["fallback"] and "ns_steps" not in table["optimizer"]["fallback"]


def test_config_file_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[optimizer]\nlr = 0.1\nlr = 0.2\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: duplicate key optimizer\.lr \(line 3"):
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
