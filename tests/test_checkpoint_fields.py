"""Every field of a checkpoint is checked before anything is restored (conformance.run.validate).

A checkpoint is tampered as someone who knows the format would: the file changed AND every hash
that vouches for it rewritten (tests/support/tamper.py), so the hashes pass and only the checks of
what the state means stand in the way. Each tamper is refused with a CheckpointError that names the
file and the field; the negative control of each is that the plain integrity check
(`load_checkpoint`) accepts the same directory, so it is the field check that catches it. On a real
checkpoint of each trainer (torch, JAX), with dynamic loss scaling, a skipped update and an
evaluation so that every counter has a value.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tamper import edit_state, edit_tensors, rehash_manifest, rewrite
from support.trainers import FRAMEWORKS, Trainer, linear_config

from conformance import checkpoint as ck
from conformance.cli import main
from conformance.errors import CheckpointError
from conformance.run.resume import load_valid

STEP = 4  # the checkpoint tampered with: after 4 of 6 updates (update 2 skipped)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, one_thread: Any) -> dict[str, tuple[Path, Path]]:
    """(run directory, its config file) per trainer."""
    import importlib

    out = {}
    for name in FRAMEWORKS:
        base = tmp_path_factory.mktemp(f"fields-{name}")
        config = linear_config(precision={"loss_scale": "dynamic", "init_scale": 1024.0, "growth_interval": 3},
                               run={"inject_nonfinite": [2]})
        config["checkpoint"] = {"every": 2, "keep_last": 10}
        trainer = Trainer(name, importlib.import_module(f"ref_{name}.trainer"))
        trainer.train(config, base / "run")
        from conformance import tomlio

        path = base / "config.toml"
        path.write_text(tomlio.dumps(config))
        out[name] = (base / "run", path)
    return out


@pytest.fixture(params=FRAMEWORKS)
def step(request: pytest.FixtureRequest, runs: dict[str, tuple[Path, Path]], tmp_path: Path) -> Path:
    """A private copy of the checkpoint after STEP updates of each trainer's run."""
    copy = tmp_path / "checkpoints"
    shutil.copytree(runs[request.param][0] / "checkpoints", copy)
    return copy / ck.step_name(STEP)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node = meta
        for part in head:
            node = node[part]
        node[last] = value
    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node = meta
        for part in head:
            node = node[part]
        del node[last]
    return change


STATE_TAMPERS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "negative-counter": (_set("counters.skipped_total", -1), "counters.skipped_total must be an integer in"),
    "schedule-t-minus-5": (_set("counters.schedule_t", -5), "counters.schedule_t must be an integer in"),
    "schedule-t-off-by-one": (_set("counters.schedule_t", STEP), "counters.schedule_t must be 3"),
    "schedule-disagrees": (_set("schedule.t", 2), "schedule.t must be counters.schedule_t"),
    "updates-done": (_set("counters.updates_done", STEP + 1), "counters.updates_done must be 4"),
    "counter-as-string": (_set("counters.consecutive_skips", "0"), "counters.consecutive_skips must be an integer"),
    "counter-as-bool": (_set("counters.skipped_total", True), "counters.skipped_total must be an integer"),
    "unbounded-counter": (_set("counters.skipped_total", 2**80), "counters.skipped_total must be an integer in"),
    "loss-scale-zero": (_set("loss_scale.scale", 0.0), "loss_scale.scale must be a finite float32 > 0"),
    "loss-scale-negative": (_set("loss_scale.scale", -1.0), "loss_scale.scale must be a finite float32 > 0"),
    "loss-scale-beyond-float32": (_set("loss_scale.scale", 1e39), "loss_scale.scale must be a finite float32"),
    "growth-tracker": (_set("loss_scale.growth_tracker", 3), "loss_scale.growth_tracker must be an integer in"),
    "loss-scale-missing": (_set("loss_scale", None), "loss_scale must be a table"),
    "optimizer-step": (_set("optimizer_step", 4), "optimizer_step must be updates_done - skipped_total"),
    "best-val-loss-string": (_set("counters.best_val_loss", "low"), "counters.best_val_loss must be a finite"),
    "data-position": (_set("data.updates_done", 2), "data.updates_done must be 4"),
    "val-loss-disagrees": (_set("val_loss", 0.125), "val_loss must be manifest.json's val_loss"),
    "unknown-key": (_set("note", 1), "note is not a field of a twinstep checkpoint"),
    "missing-key": (_drop("schedule"), "schedule is missing"),
    "numpy-rng-pos": (_set("rng.rank0.numpy_global.pos", 625), "rng.rank0.numpy_global.pos must be"),
    "python-rng-version": (_set("rng.rank0.python_random.version", 2), "rng.rank0.python_random.version must be 3"),
    "rng-meta-missing": (_drop("rng.rank0"), "rng.rank0 is missing"),
    "backend": (_set("backend", "tensorflow"), "backend must be one of"),
}


@pytest.mark.parametrize("tamper", list(STATE_TAMPERS))
def test_a_rehashed_state_field_is_refused_naming_it(step: Path, tamper: str) -> None:
    change, field = STATE_TAMPERS[tamper]
    edit_state(step, change)
    ck.load_checkpoint(step)  # negative control: every hash agrees, the integrity check passes
    with pytest.raises(CheckpointError, match="state.json: " + field.replace("(", r"\(").replace(")", r"\)")):
        load_valid(step)


def test_an_infinite_loss_scale_written_as_1e999_is_refused(step: Path) -> None:
    # JSON has no inf, but 1e999 parses to it (the probe)
    edit_state(step, _set("loss_scale.scale", 7.0), raw=lambda text: text.replace('"scale": 7.0', '"scale": 1e999'))
    assert math.isinf(ck.load_checkpoint(step).state.meta["loss_scale"]["scale"])
    with pytest.raises(CheckpointError, match="loss_scale.scale must be a finite float32 > 0"):
        load_valid(step)


def _first(tensors: dict[str, np.ndarray], prefix: str) -> str:
    return sorted(k for k in tensors if k.startswith(prefix))[0]


def _drop_param(tensors: dict[str, np.ndarray]) -> None:
    param = _first(tensors, "optimizer/").split("/")[1]
    for key in [k for k in tensors if k.split("/")[1] == param]:
        del tensors[key]


def _scale(key_part: str, factor: float) -> Callable[[dict[str, np.ndarray]], None]:
    def change(tensors: dict[str, np.ndarray]) -> None:
        key = sorted(k for k in tensors if k.endswith(key_part))[0]
        tensors[key] = np.asarray(tensors[key] * factor).astype(tensors[key].dtype)
    return change


def _resize(name: str) -> Callable[[dict[str, np.ndarray]], None]:
    def change(tensors: dict[str, np.ndarray]) -> None:
        tensors[name] = tensors[name][:-1].copy()
    return change


TENSOR_TAMPERS: dict[str, tuple[str, Callable[[dict[str, np.ndarray]], None], str]] = {
    "optimizer-entry-missing": ("optimizer.safetensors", _drop_param, r"optimizer.safetensors: optimizer/\S+ is missing"),
    "optimizer-moment-shape": ("optimizer.safetensors",
                               lambda t: t.__setitem__(sorted(k for k in t if k.endswith("/m"))[0], np.zeros(7)),
                               "optimizer.safetensors: optimizer state .* must have shape"),
    "optimizer-step-value": ("optimizer.safetensors", _scale("/step", 2), "optimizer.safetensors: optimizer/.*/step must be 3"),
    "optimizer-nonfinite": ("optimizer.safetensors", _scale("/v", math.inf), "optimizer.safetensors: .*non-finite"),
    "rng-empty": ("rng.safetensors", lambda t: t.clear(), "rng.safetensors: rng/rank0/python_random is missing"),
    "rng-python-short": ("rng.safetensors", _resize("rng/rank0/python_random"),
                         r"rng.safetensors: rng/rank0/python_random must be uint32 of shape \(625,\)"),
    "rng-unknown": ("rng.safetensors", lambda t: t.__setitem__("rng/rank1/python_random", t["rng/rank0/python_random"]),
                    "rng.safetensors: tensor rng/rank1/python_random is not an RNG state"),
}


@pytest.mark.parametrize("tamper", list(TENSOR_TAMPERS))
def test_rehashed_tensors_are_refused_naming_them(step: Path, tamper: str) -> None:
    name, change, match = TENSOR_TAMPERS[tamper]
    edit_tensors(step, name, change)
    ck.load_checkpoint(step)  # negative control: the integrity check passes
    with pytest.raises(CheckpointError, match=match):
        load_valid(step)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_writing_frameworks_generator_must_be_there(runs: dict[str, tuple[Path, Path]], tmp_path: Path,
                                                        framework: str) -> None:
    copy = tmp_path / "c"
    shutil.copytree(runs[framework][0] / "checkpoints" / ck.step_name(STEP), copy / ck.step_name(STEP))
    step = copy / ck.step_name(STEP)
    own = {"torch": "torch_cpu", "jax": "jax_key"}[framework]
    edit_tensors(step, "rng.safetensors", lambda t: t.pop(f"rng/rank0/{own}"))
    with pytest.raises(CheckpointError, match=f"rng/rank0/{own} is missing"):
        load_valid(step)


@pytest.mark.parametrize("text, match", [
    ("[run]\nx = " + "[" * 5000 + "]" * 5000 + "\n", "config.toml: .*nest more than"),
    ('[run]\nseed = "zero"\n', "config.toml: the saved config is not valid: run.seed"),
    ("[run\n", "config.toml: .*invalid TOML"),
])
def test_a_rehashed_config_that_cannot_be_read_is_refused(step: Path, text: str, match: str) -> None:
    rewrite(step, "config.toml", text.encode())
    ck.load_checkpoint(step)
    with pytest.raises(CheckpointError, match=match):
        load_valid(step)


def test_manifest_fields_are_cross_checked_with_the_state(step: Path) -> None:
    rehash_manifest(step, lambda m: m.__setitem__("world_size", 2))
    ck.load_checkpoint(step)
    with pytest.raises(CheckpointError, match="state.json: rng.rank1 is missing"):
        load_valid(step)


def test_a_pristine_checkpoint_verifies(step: Path) -> None:
    config = load_valid(step).state.config  # the positive control of every refusal above
    assert "[run]" in config


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("tamper", ["negative-counter", "loss-scale-zero", "optimizer-entry-missing"])
def test_resume_from_a_rehashed_checkpoint_is_one_line_exit_2(runs: dict[str, tuple[Path, Path]], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture, framework: str,
                                                             tamper: str) -> None:
    run, config = runs[framework]
    out = tmp_path / "run"
    shutil.copytree(run, out)
    for update, path in ck.list_checkpoints(out / "checkpoints"):
        if update > STEP:
            shutil.rmtree(path)
    step = out / "checkpoints" / ck.step_name(STEP)
    if tamper in STATE_TAMPERS:
        edit_state(step, STATE_TAMPERS[tamper][0])
        field = STATE_TAMPERS[tamper][1].split(" must")[0]
    else:
        edit_tensors(step, "optimizer.safetensors", _drop_param)
        field = "optimizer/"
    before = sorted((p.name, p.stat().st_size) for p in out.rglob("*") if p.is_file())
    capsys.readouterr()
    assert main(["train", str(config), "--backend", framework, "--out", str(out), "--resume", "--progress", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("twinstep: error: ") and str(step) in err[0] and field in err[0], err
    assert "older checkpoint step-00000002 verifies" in err[0] and "checkpoint.allow_fallback=true" in err[0]
    assert sorted((p.name, p.stat().st_size) for p in out.rglob("*") if p.is_file()) == before


@pytest.mark.parametrize("field, value", [("epoch", 9), ("samples_seen", 1), ("dataset", "digits"),
                                          ("world_size", 0), ("first_micro_batch", "3")])
def test_the_saved_data_position_must_be_the_runs(runs: dict[str, tuple[Path, Path]], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture, field: str, value: Any) -> None:
    run, config = runs["torch"]
    out = tmp_path / "run"
    shutil.copytree(run, out)
    step = out / "checkpoints" / ck.step_name(6)
    edit_state(step, _set(f"data.{field}", value))
    capsys.readouterr()
    assert main(["train", str(config), "--out", str(out), "--resume", "--progress", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{step}/state.json: data.{field} must be" in err[0], err
