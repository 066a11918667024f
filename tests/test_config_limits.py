"""Config strictness: what a config may not be, each refused with one line, exit 2.

- Bounded before parsing: a FIFO or a device as the config (refused at once, never read), a 64 MiB
  file (refused by its size, not read), 5000 levels of nesting (refused before tomllib recurses);
  integers beyond int64 anywhere (seed 2^70); duplicate keys named with their line.
- `--set` takes exactly one key = value: a line break or a second value is refused, never parsed as
  more config; an index it cannot follow says why.
- Cross-field checks on both trainers (conformance/run/preflight.py): batch_size larger than the
  training set, a cosine eta_min above the lr, inject_nonfinite past the end of the run.
- A run that ends non-finite is not a success.
- A float hyper-parameter the parameters' dtype cannot hold (lr 1e39 in a float32 run) is refused
  by the config, naming the field, on both trainers; a step scalar the
  hyper-parameters make too large (Adam's lr / (1 - beta1) near float32's largest value) stops the
  run with one line, exit 2, on both.

Each refusal has its positive control: the value at the edge of the range is accepted.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from support.trainers import FRAMEWORKS

from conformance.cli import main
from conformance.config import MAX_CONFIG_BYTES, apply_overrides, load_config
from conformance.errors import ConfigError
from conformance.tomlio import MAX_DEPTH


def one_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("twinstep: error: "), err
    assert "Traceback" not in err[0] and "internal error" not in err[0]
    return err[0]


def config_cli(capsys: pytest.CaptureFixture, *args: str) -> str:
    capsys.readouterr()
    assert main(["config", *args]) == 2
    return one_error(capsys)


def test_seed_2_to_the_70_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[run]\nseed = {2**70}\n")
    assert "run.seed must fit in 64 bits" in config_cli(capsys, str(path))
    path.write_text(f"[run]\nseed = {2**63 - 1}\n")
    assert load_config(path).run.seed == 2**63 - 1  # the edge is accepted


@pytest.mark.parametrize("value, field", [
    (f"[schedule]\nname = 'multistep'\nmilestones = [1, {2**64}]\n", "schedule.milestones[1] must fit in 64 bits"),
    (f"[loss]\nignore_index = {-(2**63) - 1}\n", "loss.ignore_index must fit in 64 bits"),
    (f"[run]\nmax_updates = {2**31}\n", "run.max_updates must be in [1, 2147483647]"),
    ("[run]\nseed = 1" + "0" * 5000 + "\n", "cannot be parsed"),
])
def test_integers_are_bounded_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture, value: str, field: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(value)
    assert field in config_cli(capsys, str(path))


def test_5000_levels_of_nesting_are_refused_before_parsing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[run]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    assert f"nest more than {MAX_DEPTH} levels deep" in config_cli(capsys, str(path))
    path.write_text("[run]\n" + ".".join(["x"] * 5000) + " = 1\n")  # dotted keys nest too
    assert f"nest more than {MAX_DEPTH} levels deep" in config_cli(capsys, str(path))
    deep: Any = 1
    for _ in range(5000):
        deep = {"x": deep}
    with pytest.raises(ConfigError, match="nests more than 32 levels deep"):  # a dict from Python, too
        load_config({"run": deep})
    path.write_text("[run]\nx = " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "\n")  # 32 levels with [run]
    assert "run.x is not a known key" in config_cli(capsys, str(path))  # parsed: only the key is wrong


def test_a_64_mib_config_is_refused_by_its_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "c.toml"
    with open(path, "wb") as f:
        f.truncate(64 << 20)  # sparse: nothing to read, and nothing is read
    assert f"has {64 << 20} bytes; a config may have at most {MAX_CONFIG_BYTES}" in config_cli(capsys, str(path))


def test_a_fifo_or_a_device_as_the_config_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    assert "c.toml is a FIFO (named pipe), not a regular file" in config_cli(capsys, str(fifo))
    assert "/dev/zero is a character device, not a regular file" in config_cli(capsys, "/dev/zero")


def test_negative_control_a_naive_reader_blocks_on_the_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: fifo.read_bytes(), daemon=True)  # open() waits for a writer
    reader.start()
    reader.join(0.5)
    assert reader.is_alive()  # still blocked: what the refusal above avoids
    with open(fifo, "wb"):  # release it
        pass
    reader.join(5)


@pytest.mark.parametrize("text, named", [
    ("[run]\nseed = 1\nseed = 2\n", "duplicate key run.seed (line 3"),
    ("[run]\nseed = 1\n[optimizer]\nlr = 0.1\n[run]\nepochs = 2\n", "table [run] is declared twice (line 5)"),
    ("optimizer.lr = 0.1\noptimizer.lr = 0.2\n", "duplicate key optimizer.lr (line 2"),
])
def test_duplicate_keys_are_named(tmp_path: Path, capsys: pytest.CaptureFixture, text: str, named: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert named in config_cli(capsys, str(path))


@pytest.mark.parametrize("override, message", [
    ("optimizer.lr=1e-3\n[run]\nseed = 5", "spans several lines; --set takes exactly one key=value"),
    ("optimizer.lr=1e-3 seed = 5", "is not one valid TOML value"),
    ("optimizer.betas[0][1]=3", "the config does not spell out optimizer.betas as a list, so it has no element 0"),
    ("optimizer.lr[0]=3", "the config does not spell out optimizer.lr as a list"),
])
def test_set_takes_exactly_one_key_and_value(capsys: pytest.CaptureFixture, override: str, message: str) -> None:
    assert message in config_cli(capsys, "--set", override)


def test_set_index_positive_controls() -> None:
    data = apply_overrides({"optimizer": {"betas": [0.9, 0.99]}}, ["optimizer.betas[1]=0.95", "optimizer.lr=1e-3"])
    assert data == {"optimizer": {"betas": [0.9, 0.95], "lr": 1e-3}}
    with pytest.raises(ConfigError, match="optimizer.betas has 2 element"):
        apply_overrides(data, ["optimizer.betas[2]=0.5"])


def train(capsys: pytest.CaptureFixture, tmp_path: Path, framework: str, *sets: str) -> int:
    capsys.readouterr()
    args = ["train", "--backend", framework, "--out", str(tmp_path / "run"), "--progress", "none",
            "--set", "run.max_updates=4"]
    for item in sets:
        args += ["--set", item]
    return main(args)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("sets, message", [
    (("data.batch_size=100000",), "data.batch_size = 100000 is larger than the training set"),
    (("schedule.name=\"cosine\"", "schedule.t_max=4", "schedule.eta_min=0.5"),
     "schedule eta_min = 0.5 is above the lowest group lr 0.001"),
    (("run.inject_nonfinite=[1, 4]",), "run.inject_nonfinite lists update 4, but the run makes 4 updates"),
])
def test_cross_field_checks_refuse_on_both_trainers(capsys: pytest.CaptureFixture, tmp_path: Path, framework: str,
                                                   sets: tuple[str, ...], message: str) -> None:
    assert train(capsys, tmp_path, framework, *sets) == 2
    assert message in one_error(capsys)
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("sets", [("run.inject_nonfinite=[3]",), ("schedule.name=\"cosine\"", "schedule.t_max=4",
                                                                   "schedule.eta_min=0.001")])
def test_cross_field_edges_are_accepted(capsys: pytest.CaptureFixture, tmp_path: Path, sets: tuple[str, ...]) -> None:
    assert train(capsys, tmp_path, "torch", *sets) == 0


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_run_ending_with_non_finite_parameters_is_not_a_success(capsys: pytest.CaptureFixture, tmp_path: Path,
                                                                 framework: str) -> None:
    # float64: lr 1e308 is a number the parameters' dtype holds, and the update overflows them
    assert train(capsys, tmp_path, framework, "optimizer.lr=1e308", "precision.dtype=\"float64\"") == 2
    *warned, last = capsys.readouterr().err.strip().splitlines()  # JAX: NumPy's overflow warnings, one line each
    assert last.startswith("twinstep: error: the run ended with non-finite parameter")
    assert all(w.startswith("twinstep: warning: ") for w in warned) and "Traceback" not in last


def test_skipped_updates_are_counted_in_the_summary(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert train(capsys, tmp_path, "torch", "run.inject_nonfinite=[1, 3]") == 0  # skip: the policy asked for it
    err = capsys.readouterr().err
    assert "2 of 4 updates skipped (non-finite)" in err and "last loss inf" in err


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("sets, message", [
    (("optimizer.lr=1e39",), "optimizer.lr = 1e+39 does not fit float32"),
    (("optimizer.name=\"sgd\"", "optimizer.lr=1e308"), "optimizer.lr = 1e+308 does not fit float32"),
    (("precision.dtype=\"bfloat16\"", "optimizer.groups=[{params = [\"0.*\"], weight_decay = -0.0, lr = 4e38}]"),
     "optimizer.groups[0].lr = 4e+38 does not fit float32"),
    (("optimizer.weight_decay=1e39",), "optimizer.weight_decay = 1e+39 does not fit float32"),
])
def test_a_hyper_parameter_the_dtype_cannot_hold_is_refused(capsys: pytest.CaptureFixture, tmp_path: Path,
                                                            framework: str, sets: tuple[str, ...], message: str) -> None:
    assert train(capsys, tmp_path, framework, *sets) == 2
    assert message in one_error(capsys)
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("sets", [("optimizer.lr=3.4e38",),
                                  ("optimizer.eps=1e-50",), ("schedule.name=\"exponential\"", "schedule.gamma=1e39"),
                                  ("optimizer.lr=1e39", "precision.dtype=\"float64\"")])
def test_negative_control_what_the_dtype_holds_is_accepted(sets: tuple[str, ...]) -> None:
    load_config(overrides=list(sets))  # float32's largest; a tiny eps (0 in float32 on both sides); a schedule's
    # factor stays a Python float; float64 holds 1e39


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_step_scalar_that_overflows_the_dtype_is_one_line(capsys: pytest.CaptureFixture, tmp_path: Path,
                                                            framework: str) -> None:
    # 3e38 fits float32, but Adam's first step size lr / (1 - 0.9) does not
    assert train(capsys, tmp_path, framework, "optimizer.lr=3e38") == 2
    *warned, last = capsys.readouterr().err.strip().splitlines()  # JAX: NumPy's overflow warnings, one line each
    assert all(w.startswith("twinstep: warning: ") for w in warned) and "internal error" not in last
    # torch refuses the step that overflows; JAX applies it (inf) and the run ends non-finite
    assert last.startswith("twinstep: error: ") and ("update 0: the optimizer step overflows float32" in last
                                                      or "ended with non-finite parameter" in last)
