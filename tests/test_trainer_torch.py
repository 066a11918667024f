"""The torch trainer's behaviour: the non-finite path (inject_nonfinite, skip, hold, raise), the
train/eval lifecycle, evaluation against torch built-ins, metrics extras, devices and errors.
Run-level numerics against an independent loop are the `train` conformance cases
(conformance/cases/train, tools/gen_train_cases.py); their negative controls are at the end."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.config.precision import PrecisionSpec
from conformance.data import DataPipeline
from conformance.errors import (
    CheckpointError,
    ConfigError,
    NonFiniteError,
    TwinstepError,
)
from conformance.harness.backends import Backend
from conformance.harness.case import load_case
from conformance.harness.runner import run_case
from conformance.run.metrics import evals, read_metrics, updates
from ref_torch import trainer as tr

CASES = Path(__file__).resolve().parents[1] / "conformance" / "cases" / "train"
LINEAR = {"model": {"name": "linear"}, "data": {"name": "linear_regression", "batch_size": 16},
          "loss": {"name": "mse"}, "optimizer": {"name": "sgd", "lr": 0.2}, "run": {"epochs": 2, "device": "cpu"}}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cfg(base: dict, *overrides: str):
    return load_config(base, list(overrides))


def run(config, out: Path, **kw):
    result = tr.train(config, out, progress="none", **kw)
    return result, read_metrics(out / "metrics.jsonl")


# --- the non-finite path ----------------------------------------------------------------------

@pytest.mark.parametrize("on_skip", ["hold", "advance"])
def test_injected_overflows_are_skipped_with_backoff_and_schedule_policy(tmp_path: Path, on_skip: str) -> None:
    config = cfg(LINEAR, "precision.loss_scale=\"dynamic\"", "precision.init_scale=256.0",
                 "precision.growth_interval=100", f"precision.schedule_on_skip=\"{on_skip}\"",
                 "schedule.name=\"step\"", "schedule.step_size=1", "schedule.gamma=0.5", "run.inject_nonfinite=[2, 3, 6]")
    result, records = run(config, tmp_path / "run")
    ups = updates(records)
    assert [r["skipped"] for r in ups] == [t in (2, 3, 6) for t in range(8)]
    assert [r["loss_scale"] for r in ups] == [256.0, 256.0, 256.0, 128.0, 64.0, 64.0, 64.0, 32.0]
    assert all(r["loss"] == math.inf and r["grad_norm"] is None for r in ups if r["skipped"])
    assert result.losses == [r["loss"] for r in ups]
    # the lr of update t is 0.2 · 0.5^(schedule position); hold: skipped updates do not advance it
    position = 0
    for t, r in enumerate(ups):
        assert r["lr"] == [0.2 * 0.5**position], (t, r["lr"])
        position += 1 if (not r["skipped"] or on_skip == "advance") else 0


def test_skipped_update_leaves_parameters_and_optimizer_state_untouched(tmp_path: Path) -> None:
    base = cfg(LINEAR, "precision.loss_scale=\"dynamic\"", "optimizer.momentum=0.9", "checkpoint.every=1",
               "checkpoint.keep_last=100", "run.inject_nonfinite=[4]", "run.epochs=2")
    run(base, tmp_path / "run")
    before = ck.load_checkpoint(tmp_path / "run" / "checkpoints" / ck.step_name(4)).state
    after = ck.load_checkpoint(tmp_path / "run" / "checkpoints" / ck.step_name(5)).state
    for k in before.model:
        assert np.array_equal(before.model[k], after.model[k])
    for p, states in before.optimizer.items():
        for name, value in states.items():
            assert np.array_equal(value, after.optimizer[p][name]), (p, name)
    assert after.meta["counters"]["skipped_total"] == 1 and after.meta["schedule"]["t"] == 4


def test_nonfinite_raise_stops_with_the_last_checkpoint_intact(tmp_path: Path) -> None:
    config = cfg(LINEAR, "precision.on_nonfinite=\"raise\"", "checkpoint.every=2", "run.inject_nonfinite=[5]")
    with pytest.raises(NonFiniteError, match="loss"):
        tr.train(config, tmp_path / "run", progress="none")
    assert [u for u, _ in ck.list_checkpoints(tmp_path / "run" / "checkpoints")] == [4, 2]
    ck.verify_checkpoint(tmp_path / "run" / "checkpoints" / ck.step_name(4))
    assert len(updates(read_metrics(tmp_path / "run" / "metrics.jsonl"))) == 5  # updates 0..4 logged


def test_too_many_consecutive_skips_stop_the_run(tmp_path: Path) -> None:
    config = cfg(LINEAR, "precision.loss_scale=\"dynamic\"", "precision.max_consecutive_skips=2",
                 "run.inject_nonfinite=[1, 2, 3]")
    with pytest.raises(NonFiniteError, match="3 updates in a row|consecutive"):
        tr.train(config, tmp_path / "run", progress="none")


# --- train / eval lifecycle and evaluation ----------------------------------------------------

GPT_DROPOUT = {"model": {"name": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "dropout": 0.3},
               "data": {"name": "text", "batch_size": 4}, "run": {"max_updates": 6, "device": "cpu"}}


def test_evaluation_does_not_disturb_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluating after every update (eval mode, inference_mode, no RNG draws) leaves the trajectory
    of a dropout model bit-identical; an evaluation that forgets model.train() is caught."""
    base = dict(GPT_DROPOUT, data={**GPT_DROPOUT["data"], "path": str(_corpus(tmp_path))})
    quiet, _ = run(cfg(base, "run.eval_every=0"), tmp_path / "a")
    busy, records = run(cfg(base, "run.eval_every=1"), tmp_path / "b")
    assert len(evals(records)) == 6
    assert all(np.array_equal(quiet.params[k], busy.params[k]) for k in quiet.params)
    real = tr._evaluate

    def stays_in_eval_mode(config, run_, model, device, dtype):
        out = real(config, run_, model, device, dtype)
        model.eval()
        return out

    monkeypatch.setattr(tr, "_evaluate", stays_in_eval_mode)
    broken, _ = run(cfg(base, "run.eval_every=1"), tmp_path / "c")
    assert not all(np.array_equal(quiet.params[k], broken.params[k]) for k in quiet.params)


def _corpus(tmp: Path) -> Path:
    path = tmp / "corpus.txt"
    path.write_text(" ".join(np.random.default_rng(3).choice(["one", "two", "three", "four"], 200)))
    return path


def test_val_loss_and_accuracy_equal_torch_builtins(tmp_path: Path) -> None:
    config = cfg({"model": {"name": "mlp", "hidden": [16]}, "data": {"name": "digits", "batch_size": 64,
                  "eval_batch_size": 50}, "run": {"epochs": 1, "eval_every": 1000, "device": "cpu"}},
                 "precision.dtype=\"float64\"")
    result, records = run(config, tmp_path / "run")
    last = evals(records)[-1]
    data = DataPipeline(config)
    x, y = torch.from_numpy(data.dataset.val.x), torch.from_numpy(data.dataset.val.y)
    w = {k: torch.from_numpy(v) for k, v in result.params.items()}
    h = F.layer_norm(F.gelu(x @ w["0.weight"].T + w["0.bias"]), (16,), w["2.weight"], w["2.bias"])
    logits = h @ w["3.weight"].T + w["3.bias"]
    assert last["val_loss"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-12)
    assert last["val_accuracy"] == float((logits.argmax(1) == y).double().mean())


def test_text_runs_log_tokens_per_second(tmp_path: Path) -> None:
    base = dict(GPT_DROPOUT, data={**GPT_DROPOUT["data"], "path": str(_corpus(tmp_path))})
    _, records = run(cfg(base, "run.max_updates=2"), tmp_path / "run")
    for r in updates(records):
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 8)
        assert "mfu" not in r  # only on an accelerator with a known peak


def test_tensorboard_event_files(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, records = run(cfg(LINEAR, "run.tensorboard=true", "run.epochs=1", "data.val_fraction=0.25",
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


def test_tensorboard_without_the_package_names_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now raises ImportError
    with pytest.raises(TwinstepError, match=r"run.tensorboard = true needs the tensorboard package"):
        run(cfg(LINEAR, "run.tensorboard=true", "run.epochs=1"), tmp_path / "run")


def test_resuming_a_finished_run_does_nothing(tmp_path: Path) -> None:
    first, _ = run(cfg(LINEAR), tmp_path / "run")
    again, records = run(cfg(LINEAR), tmp_path / "run", resume=True)
    assert again.losses == [] and again.updates_done == 8 and again.checkpoint is None
    assert all(np.array_equal(first.params[k], again.params[k]) for k in first.params)
    assert len(updates(records)) == 8


def test_cuda_requested_without_a_gpu_is_a_config_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="run.device = 'cuda'"):
        tr.train(cfg(LINEAR, "run.device=\"cuda\""), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_loss_that_does_not_fit_the_data_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="loss.name = 'cross_entropy' does not fit"):
        tr.train(cfg(LINEAR, "loss.name=\"cross_entropy\""), tmp_path / "run")


def test_world_size_without_a_launcher_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="torchrun"):
        tr.train(cfg(LINEAR), tmp_path / "run", rank=0, world_size=2)


def test_resume_from_another_data_position_is_refused(tmp_path: Path) -> None:
    run(cfg(LINEAR), tmp_path / "run")
    with pytest.raises(CheckpointError, match="data.batch_size"):
        tr.train(cfg(LINEAR, "data.batch_size=8"), tmp_path / "run", resume=True, progress="none")


def test_resume_with_a_shorter_run_is_refused(tmp_path: Path) -> None:
    run(cfg(LINEAR), tmp_path / "run")
    with pytest.raises(CheckpointError, match="holds 8 updates, but this config plans 4"):
        tr.train(cfg(LINEAR, "run.epochs=1"), tmp_path / "run", resume=True, progress="none")


@pytest.mark.slow
def test_compiled_model_trains_like_the_eager_one(tmp_path: Path) -> None:
    eager, _ = run(cfg(LINEAR, "precision.dtype=\"float64\""), tmp_path / "a")
    compiled, _ = run(cfg(LINEAR, "precision.dtype=\"float64\"", "run.compile=true"), tmp_path / "b")
    for k in eager.params:
        np.testing.assert_allclose(compiled.params[k], eager.params[k], rtol=1e-12)


# --- negative controls of the train cases -----------------------------------------------------

def _case(name: str):
    return load_case(next(CASES.rglob(f"{name}.toml")))


def test_train_cases_pass_on_torch() -> None:
    for name in ("fp16-injected-overflows", "accumulation-incomplete-window"):
        result = run_case(_case(name), Backend("torch"))
        assert result.passed, result.message


def test_schedule_stepped_on_skipped_updates_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PrecisionSpec, "schedule_advances", lambda self, skipped: True)
    result = run_case(_case("fp16-injected-overflows"), Backend("torch"))
    assert not result.passed and result.message.startswith(("final_params", "lr"))


def test_injection_ignored_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tr, "injected", lambda config, t: False)
    result = run_case(_case("fp16-injected-overflows"), Backend("torch"))
    assert not result.passed


def test_incomplete_window_divided_by_the_configured_steps_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-2024 accumulation bug: the last, shorter window divided by accumulation.steps."""
    from ref_torch import _update

    real = _update.accumulate_gradients

    def uncorrected(spec, loss_fn, params, window, *args, **kwargs):
        n = len(window)

        def scaled(p, mb):
            out = loss_fn(p, mb)
            return out._replace(value=out.value * n / spec.steps)

        return real(spec, scaled, params, window, *args, **kwargs)

    monkeypatch.setattr(_update, "accumulate_gradients", uncorrected)
    result = run_case(_case("accumulation-incomplete-window"), Backend("torch"))
    assert not result.passed
