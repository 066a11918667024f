"""The trainers' behaviour, one test body for both frameworks (`[torch]`, `[jax]`): the files and
metrics of docs/contract.md §5, refused resumes, the non-finite path (inject_nonfinite, skip, hold,
raise), evaluation, precision policies and one-line errors. The `train` conformance cases and their
negative controls are tests/test_trainer_cases.py; what only one framework has (torch's train/eval
modes and torch.compile; JAX's torch-equal initial weights, padded windows, the one compiled and
donating step, the numerics context scoped to the run) is tests/test_trainer_frameworks.py.

Runs are tiny (the linear model compiles in about a second). Run-level numerics against an
independent loop are the `train` conformance cases (conformance/cases/train,
tools/gen_train_cases.py); cross-framework equality of whole runs is tests/test_cross_framework.py,
exact resume tests/test_resume_kill.py and tests/test_cross_resume.py, several processes or devices
tests/test_data_parallel.py, CUDA tests/test_trainer_torch_cuda.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.processes import PROCESS_S, run_process
from support.trainers import (
    LINEAR,
    ROOT,
    Trainer,
    cfg,
    each_trainer,
    gpt_dropout,
    linear_config,
)

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.data import DataPipeline
from conformance.errors import (
    CheckpointError,
    ConfigError,
    NonFiniteError,
    TwinstepError,
)
from conformance.run.metrics import EVAL_KEYS, UPDATE_KEYS, evals, read_metrics, updates

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# files, metrics and checkpoints (docs/contract.md §5)
# ---------------------------------------------------------------------------------------------

RNG_OF = {"torch": "rank0/torch_cpu", "jax": "rank0/jax_key"}  # each framework's own generator state


def test_run_writes_the_contract_files(trainer: Trainer, tmp_path: Path) -> None:
    result = trainer.train(linear_config(), tmp_path / "run")
    out = tmp_path / "run"
    assert result.updates_done == 6 and len(result.losses) == 6
    assert load_config(out / "config.toml") == load_config(linear_config())
    records = read_metrics(out / "metrics.jsonl")
    ups = updates(records)
    assert [r["update"] for r in ups] == list(range(6))
    for r in ups:
        assert set(UPDATE_KEYS) <= set(r) and len(r["lr"]) == 1 and r["loss_scale"] is None
    assert [r["samples_seen"] for r in ups] == [30, 48, 78, 96, 126, 144]
    assert result.losses == [r["loss"] for r in ups]
    evs = [r for r in records if r["event"] == "eval"]
    assert [r["update"] for r in evs] == [1, 3, 5] and all(set(EVAL_KEYS) <= set(r) for r in evs)
    assert sorted(u for u, _ in ck.list_checkpoints(out / "checkpoints")) == [4, 6]  # keep_last = 2
    assert result.checkpoint == out / "checkpoints" / ck.step_name(6)
    state = ck.load_checkpoint(out / "checkpoints" / ck.step_name(6)).state
    assert set(state.model) == {"weight", "bias"} and state.model["weight"].dtype == np.float64
    for name in ("weight", "bias"):  # docs/contract.md §4: adamw's neutral names and a per-parameter count
        assert set(state.optimizer[name]) == {"m", "v", "step"} and int(state.optimizer[name]["step"]) == 6
        np.testing.assert_array_equal(state.model[name], result.params[name])
    assert state.meta["backend"] == trainer.name and state.meta["optimizer_step"] == 6
    assert state.meta["counters"]["schedule_t"] == 6 and state.meta["data"]["updates_done"] == 6
    assert RNG_OF[trainer.name] in state.rng and "rank0/numpy_global" in state.rng


def test_existing_checkpoints_need_resume(trainer: Trainer, tmp_path: Path) -> None:
    trainer.train(linear_config(run={"epochs": 1}), tmp_path / "run")
    with pytest.raises(CheckpointError, match="pass --resume"):
        trainer.train(linear_config(run={"epochs": 1}), tmp_path / "run")


def test_resuming_a_finished_run_does_nothing(trainer: Trainer, tmp_path: Path) -> None:
    first, _ = trainer.run(cfg(LINEAR), tmp_path / "run")
    again, records = trainer.run(cfg(LINEAR), tmp_path / "run", resume=True)
    assert again.losses == [] and again.updates_done == 8 and again.checkpoint is None
    assert all(np.array_equal(first.params[k], again.params[k]) for k in first.params)
    assert len(updates(records)) == 8


def test_resume_from_another_data_position_is_refused(trainer: Trainer, tmp_path: Path) -> None:
    trainer.run(cfg(LINEAR), tmp_path / "run")
    with pytest.raises(CheckpointError, match="data.batch_size"):
        trainer.train(cfg(LINEAR, "data.batch_size=8"), tmp_path / "run", resume=True)


def test_resume_with_a_shorter_run_is_refused(trainer: Trainer, tmp_path: Path) -> None:
    trainer.run(cfg(LINEAR), tmp_path / "run")
    with pytest.raises(CheckpointError, match="holds 8 updates, but this config plans 4"):
        trainer.train(cfg(LINEAR, "run.epochs=1"), tmp_path / "run", resume=True)


def test_text_runs_log_tokens_per_second(trainer: Trainer, tmp_path: Path) -> None:
    _, records = trainer.run(cfg(gpt_dropout(tmp_path), "run.max_updates=2"), tmp_path / "run")
    for r in updates(records):
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 8)
        assert "mfu" not in r  # only on an accelerator with a known peak


def test_tensorboard_event_files(trainer: Trainer, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, records = trainer.run(cfg(LINEAR, "run.tensorboard=true", "run.epochs=1", "data.val_fraction=0.25",
                                 "run.eval_every=2"), tmp_path / "run")
    files = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = EventAccumulator(str(files[0]))
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    want: dict[str, list[tuple[int, float]]] = {}
    for r in updates(records):  # the metrics.jsonl values, under the tags TensorBoard shows
        for key in ("loss", "grad_norm", "loss_scale", "samples_per_s"):
            if isinstance(r.get(key), (int, float)):
                want.setdefault(f"train/{key}", []).append((r["update"], r[key]))
        for i, lr in enumerate(r["lr"]):
            want.setdefault(f"train/lr/group{i}", []).append((r["update"], lr))
    for r in evals(records):
        for key, value in r.items():
            if key not in ("event", "update") and isinstance(value, (int, float)):
                want.setdefault(f"eval/{key}", []).append((r["update"], value))
    assert {"train/loss", "train/grad_norm", "train/lr/group0", "eval/val_loss"} <= set(want)
    assert sorted(got) == sorted(want)
    for tag, series in want.items():  # simple_value is a float32
        assert [s for s, _ in got[tag]] == [s for s, _ in series], tag
        np.testing.assert_allclose([v for _, v in got[tag]], [v for _, v in series], rtol=1e-6, err_msg=tag)


def test_tensorboard_without_the_package_names_the_field(trainer: Trainer, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now raises ImportError
    with pytest.raises(TwinstepError, match=r"run.tensorboard / run.loggers: the tensorboard logger needs the tensorboard package"):
        trainer.run(cfg(LINEAR, "run.tensorboard=true", "run.epochs=1"), tmp_path / "run")


# ---------------------------------------------------------------------------------------------
# the non-finite path
# ---------------------------------------------------------------------------------------------


# the lr as logged: torch's is the Python float its scheduler computes; JAX's is its schedule table,
# computed in float64 and rounded to the parameter dtype (float32 here; ref_jax._train_state.schedule_tables)
LR_DTYPE = {"torch": np.float64, "jax": np.float32}


@each_trainer("on_skip", ["hold", "advance"])
def test_injected_overflows_are_skipped_with_backoff_and_schedule_policy(trainer: Trainer, tmp_path: Path,
                                                                         on_skip: str) -> None:
    config = cfg(LINEAR, "precision.loss_scale=\"dynamic\"",
                 "precision.init_scale=256.0", "precision.growth_interval=100",
                 f"precision.schedule_on_skip=\"{on_skip}\"", "schedule.name=\"step\"", "schedule.step_size=1",
                 "schedule.gamma=0.5", "run.inject_nonfinite=[2, 3, 6]")
    result, records = trainer.run(config, tmp_path / "run")
    ups = updates(records)
    assert [r["skipped"] for r in ups] == [t in (2, 3, 6) for t in range(8)]
    assert [r["loss_scale"] for r in ups] == [256.0, 256.0, 256.0, 128.0, 64.0, 64.0, 64.0, 32.0]
    assert all(r["loss"] == math.inf and r["grad_norm"] is None for r in ups if r["skipped"])
    assert result.losses == [r["loss"] for r in ups]
    # the lr of update t is 0.2 · 0.5^(schedule position); hold: skipped updates do not advance it
    position = 0
    for t, r in enumerate(ups):
        assert r["lr"] == [float(LR_DTYPE[trainer.name](0.2 * 0.5**position))], (t, r["lr"])
        position += 1 if (not r["skipped"] or on_skip == "advance") else 0


def test_skipped_update_leaves_parameters_and_optimizer_state_untouched(trainer: Trainer, tmp_path: Path) -> None:
    base = cfg(LINEAR, "precision.loss_scale=\"dynamic\"", "optimizer.momentum=0.9", "checkpoint.every=1",
               "checkpoint.keep_last=100", "run.inject_nonfinite=[4]", "run.epochs=2")
    trainer.run(base, tmp_path / "run")
    before = ck.load_checkpoint(tmp_path / "run" / "checkpoints" / ck.step_name(4)).state
    after = ck.load_checkpoint(tmp_path / "run" / "checkpoints" / ck.step_name(5)).state
    for k in before.model:
        assert np.array_equal(before.model[k], after.model[k])
    for p, states in before.optimizer.items():
        for name, value in states.items():
            assert np.array_equal(value, after.optimizer[p][name]), (p, name)
    assert after.meta["counters"]["skipped_total"] == 1 and after.meta["schedule"]["t"] == 4


def test_nonfinite_raise_stops_with_the_last_checkpoint_intact(trainer: Trainer, tmp_path: Path) -> None:
    config = cfg(LINEAR, "precision.on_nonfinite=\"raise\"", "checkpoint.every=2", "run.inject_nonfinite=[5]")
    with pytest.raises(NonFiniteError, match="loss"):
        trainer.train(config, tmp_path / "run")
    assert [u for u, _ in ck.list_checkpoints(tmp_path / "run" / "checkpoints")] == [4, 2]
    ck.verify_checkpoint(tmp_path / "run" / "checkpoints" / ck.step_name(4))
    assert len(updates(read_metrics(tmp_path / "run" / "metrics.jsonl"))) == 5  # updates 0..4 logged


def test_too_many_consecutive_skips_stop_the_run(trainer: Trainer, tmp_path: Path) -> None:
    config = cfg(LINEAR, "precision.loss_scale=\"dynamic\"", "precision.max_consecutive_skips=2",
                 "run.inject_nonfinite=[1, 2, 3]")
    with pytest.raises(NonFiniteError, match="3 updates in a row|consecutive"):
        trainer.train(config, tmp_path / "run")


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------


def test_evaluation_does_not_disturb_training(trainer: Trainer, tmp_path: Path) -> None:
    """Evaluating after every update (no dropout, no RNG draws, no state change) leaves the
    trajectory of a dropout model bit-identical."""
    base = gpt_dropout(tmp_path)
    quiet, _ = trainer.run(cfg(base, "run.eval_every=0"), tmp_path / "a")
    busy, records = trainer.run(cfg(base, "run.eval_every=1"), tmp_path / "b")
    assert len(evals(records)) == 6
    assert all(np.array_equal(quiet.params[k], busy.params[k]) for k in quiet.params)


def test_val_loss_and_accuracy_equal_torch_builtins(trainer: Trainer, tmp_path: Path) -> None:
    config = cfg({"model": {"name": "mlp", "hidden": [16]}, "data": {"name": "digits", "batch_size": 64,
                  "eval_batch_size": 50}, "run": {"epochs": 1, "eval_every": 1000, "device": "cpu"}},
                 "precision.dtype=\"float64\"")
    result, records = trainer.run(config, tmp_path / "run")
    last = evals(records)[-1]
    data = DataPipeline(config)
    x, y = torch.from_numpy(data.dataset.val.x), torch.from_numpy(data.dataset.val.y)
    w = {k: torch.from_numpy(v) for k, v in result.params.items()}
    h = F.layer_norm(F.gelu(x @ w["0.weight"].T + w["0.bias"]), (16,), w["2.weight"], w["2.bias"])
    logits = h @ w["3.weight"].T + w["3.bias"]
    assert last["val_loss"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-12)
    assert last["val_accuracy"] == float((logits.argmax(1) == y).double().mean())


# ---------------------------------------------------------------------------------------------
# precision
# ---------------------------------------------------------------------------------------------


def test_bfloat16_policy_keeps_float32_master_weights(trainer: Trainer, tmp_path: Path) -> None:
    low = trainer.train(linear_config(precision={"dtype": "bfloat16"}, run={"epochs": 2}), tmp_path / "bf16")
    ref = trainer.train(linear_config(precision={"dtype": "float32"}, run={"epochs": 2}), tmp_path / "f32")
    assert low.params["weight"].dtype == np.float32
    lines = updates(read_metrics(tmp_path / "bf16/metrics.jsonl"))
    assert all(r["loss_scale"] is None and not r["skipped"] for r in lines)
    # bfloat16 compute (8 significant bits) vs float32 over 4 updates
    np.testing.assert_allclose(low.losses, ref.losses, rtol=2e-2)
    assert low.losses != ref.losses  # the policy really computed in bfloat16


# ---------------------------------------------------------------------------------------------
# errors: one line, the shared classes
# ---------------------------------------------------------------------------------------------


def _has_gpu(name: str) -> bool:
    return torch.cuda.is_available() if name == "torch" else any(d.platform == "gpu" for d in jax.devices())


NO_GPU = {"torch": r"^run\.device = 'cuda', but torch\.cuda\.is_available\(\) is False",
          "jax": r"^run\.device = 'cuda' but JAX sees no GPU"}


def test_cuda_requested_without_a_gpu_is_a_config_error(trainer: Trainer, tmp_path: Path) -> None:
    if _has_gpu(trainer.name):
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=NO_GPU[trainer.name]):
        trainer.train(cfg(LINEAR, "run.device=\"cuda\""), tmp_path / "run")


def test_loss_that_does_not_fit_the_data_is_refused(trainer: Trainer, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="loss.name = 'cross_entropy' does not fit"):
        trainer.train(cfg(LINEAR, "loss.name=\"cross_entropy\""), tmp_path / "run")


# a world of 2 without a launcher: both trainers need torchrun's environment to join the ranks
SEVERAL_PROCESSES = {"torch": (ConfigError, "torchrun"), "jax": (ConfigError, "torchrun")}


def test_several_processes_without_a_launcher_are_refused(trainer: Trainer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    error, match = SEVERAL_PROCESSES[trainer.name]
    with pytest.raises(error, match=match):
        trainer.train(cfg(LINEAR), tmp_path / "run", rank=0, world_size=2)


def test_cli_bad_value_is_one_line_without_traceback(trainer: Trainer, tmp_path: Path) -> None:
    proc = run_process([sys.executable, "-m", "conformance", "train", "--backend", trainer.name, "--out",
                        str(tmp_path / "run"), "--set", "optimizer.betas=[0.9, 1.5]"], "refuse the config",
                       PROCESS_S, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.startswith("twinstep: error: ") and "optimizer.betas[1]" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
