"""Weight averaging in training, one body for both trainers (`[torch]`, `[jax]`): the weights' EMA
([ema]: the rule over the trained weights, skipped updates, evaluation on the EMA, the checkpoint
and its export) and schedule-free optimizers (evaluation and checkpoints at x, exact resume). The
EMA's resume after SIGKILL: tests/test_resume_kill.py (its run keeps an EMA)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from support.trainers import cfg, linear_config

from conformance import checkpoint as ck
from conformance.checkpoint.ema import ema_weights
from conformance.config import EmaSpec
from conformance.errors import CheckpointError, ConfigError
from conformance.oracle.ema import update_ema
from conformance.rules.ema import ema_due
from conformance.run.compare import compare_runs, describe_failure

pytestmark = pytest.mark.usefixtures("one_thread")

EMA = {"decay": 0.8, "every": 2, "start": 1}


def _free(name: str, **sections) -> dict:
    """linear_config with a schedule-free optimizer and no schedule (their own warm-up)."""
    config = linear_config(optimizer={"name": name, "lr": 0.1, "warmup_steps": 2, "weight_decay": 0.01}, **sections)
    config["optimizer"] = {k: v for k, v in config["optimizer"].items() if k != "weight_decay"} | {"weight_decay": 0.01}
    config["schedule"] = {"name": "constant"}
    return config


def _ema_run(trainer, tmp_path: Path, **ema) -> tuple[Path, list]:
    config = linear_config(ema={**EMA, **ema}, checkpoint={"every": 1, "keep_last": 100},
                           run={"inject_nonfinite": [4]})
    _, lines = trainer.run(config, tmp_path / "run")
    return tmp_path / "run", lines


def test_the_ema_follows_its_rule_over_the_trained_weights(trainer, tmp_path: Path) -> None:
    """Every checkpoint's EMA is the oracle's rule applied to the weights of the checkpoints before
    it (update 0: none; from update 1 every 2nd applied update; the skipped update 4 changes nothing)."""
    out, lines = _ema_run(trainer, tmp_path)
    spec = EmaSpec(**EMA)
    skipped = {r["update"] for r in lines if r.get("event") == "update" and r["skipped"]}
    assert skipped == {4}
    average = None
    for update, path in sorted(ck.list_checkpoints(out / "checkpoints")):
        state = ck.load_checkpoint(path).state
        t = update - 1
        if t not in skipped:
            average = update_ema(spec, average, state.model, t) if ema_due(spec, t) else average
        if average is None:
            assert state.ema is None, f"update {t}: an EMA before its start"
            continue
        for name, want in average.items():
            assert state.ema[name].dtype == np.float64  # float64 weights: a float64 EMA
            np.testing.assert_allclose(state.ema[name], want, rtol=1e-13, atol=1e-15, err_msg=f"update {t} {name}")
    assert average is not None
    final = ema_weights(sorted(ck.list_checkpoints(out / "checkpoints"))[-1][1])
    assert set(final) == set(average)


def test_evaluation_on_the_ema_weights(trainer, tmp_path: Path) -> None:
    """[ema] evaluate: the val_loss is the EMA weights'; without it, the training weights'. They agree
    after update 1 (the EMA's first update copies the weights) and differ after."""
    _, on = _ema_run(trainer, tmp_path / "on", evaluate=True)
    _, off = _ema_run(trainer, tmp_path / "off")
    val_on = [r["val_loss"] for r in on if r.get("event") == "eval"]
    val_off = [r["val_loss"] for r in off if r.get("event") == "eval"]
    assert len(val_on) == len(val_off) > 1 and val_on[0] == val_off[0]
    assert all(a != b for a, b in zip(val_on[1:], val_off[1:]))
    assert [r for r in on if r.get("event") == "update"][-1]["loss"] == [
        r for r in off if r.get("event") == "update"][-1]["loss"]  # training itself is the same


def test_torch_and_jax_agree_with_an_ema_and_schedule_free(tmp_path: Path) -> None:
    import importlib

    config = cfg(_free("schedule_free_adamw", ema={**EMA, "evaluate": True}))
    for name in ("torch", "jax"):
        importlib.import_module(f"ref_{name}.trainer").train(config, tmp_path / name, progress="none")
    result = compare_runs(tmp_path / "torch", tmp_path / "jax")
    assert result.passed, describe_failure(result)
    a = ema_weights(ck.find_latest(tmp_path / "torch" / "checkpoints"))
    b = ema_weights(ck.find_latest(tmp_path / "jax" / "checkpoints"))
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12)


@pytest.mark.parametrize("name", ["schedule_free_adamw", "schedule_free_sgd"])
def test_schedule_free_saves_x_and_resumes_bit_for_bit(trainer, tmp_path: Path, name: str) -> None:
    """The checkpoint holds the evaluation point x = (y − (1−β)·z)/β, not the training y; a run
    resumed from it (train point recomputed from x and z) equals the uninterrupted one bit for bit."""
    config = cfg(_free(name, checkpoint={"every": 2, "keep_last": 100}))
    full, lines = trainer.run(config, tmp_path / "full")
    state = ck.load_checkpoint(ck.find_latest(tmp_path / "full" / "checkpoints")).state
    hp_beta = config.optimizer.betas[0] if name == "schedule_free_adamw" else config.optimizer.momentum
    for k, y in full.params.items():
        x = (y - (1 - hp_beta) * state.optimizer[k]["z"]) / hp_beta
        np.testing.assert_allclose(state.model[k], x, rtol=1e-12, atol=1e-14)
        assert not np.allclose(state.model[k], y, rtol=1e-9)
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    for update, path in ck.list_checkpoints(cut / "checkpoints"):
        if update > 4:
            shutil.rmtree(path)
    resumed, rest = trainer.run(config, cut, resume=True)
    for k in full.params:
        np.testing.assert_array_equal(resumed.params[k], full.params[k])
    assert [r for r in rest if r.get("event") == "eval"] == [r for r in lines if r.get("event") == "eval"]


def test_ema_export_refuses_a_checkpoint_without_one(trainer, tmp_path: Path) -> None:
    trainer.run(linear_config(run={"max_updates": 2}), tmp_path / "run")
    with pytest.raises(CheckpointError, match="holds no EMA weights"):
        ema_weights(ck.find_latest(tmp_path / "run" / "checkpoints"))


@pytest.mark.parametrize(("table", "message"), [
    ({"evaluate": True}, "ema.evaluate needs ema.decay"),
    ({"decay": 0.9, "every": 0}, "ema.every must be in [1, 2^63 - 1]; received 0"),
    ({"decay": 1.5}, "ema.decay must be in [0, 1]; received 1.5"),
    ({"decay": 0.9, "start": -1}, "ema.start must be in [0, 2^63 - 1]; received -1"),
])
def test_ema_spec_errors_name_the_field(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        cfg({"ema": table})
    assert message in str(err.value) and "\n" not in str(err.value)
