"""The trainers' behaviour, one test body for both frameworks (`[torch]`, `[jax]`): the files and
metrics of docs/contract.md §5, refused resumes, the non-finite path (inject_nonfinite, skip, hold,
raise), evaluation, precision policies, one-line errors, and the `train` conformance cases with
their negative controls. What only one framework has is tested on its own further down: torch's
train/eval modes and torch.compile; JAX's torch-equal initial weights, padded windows, the one
compiled and donating step and the numerics context scoped to the run.

Runs are tiny (the linear model compiles in about a second). Run-level numerics against an
independent loop are the `train` conformance cases (conformance/cases/train,
tools/gen_train_cases.py); cross-framework equality of whole runs is tests/test_cross_framework.py,
exact resume tests/test_resume_kill.py and tests/test_cross_resume.py, several processes or devices
tests/test_data_parallel.py, CUDA tests/test_trainer_torch_cuda.py.
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.config.precision import PrecisionSpec
from conformance.data import DataPipeline
from conformance.errors import (
    CheckpointError,
    ConfigError,
    NonFiniteError,
    TwinstepError,
    UnsupportedError,
)
from conformance.harness.backends import Backend
from conformance.harness.case import load_case
from conformance.harness.runner import run_case
from conformance.models import init_params
from conformance.run.metrics import EVAL_KEYS, UPDATE_KEYS, evals, read_metrics, updates

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "conformance" / "cases" / "train"


class Trainer(NamedTuple):
    """One framework's trainer: `name` is the backend ("torch", "jax"), `module` its trainer module."""

    name: str
    module: ModuleType

    def train(self, config: Any, out: Path, **kw: Any) -> Any:
        return self.module.train(config if not isinstance(config, dict) else load_config(config), out,
                                 progress="none", **kw)

    def run(self, config: Any, out: Path, **kw: Any) -> tuple[Any, list[dict[str, Any]]]:
        """Train, and return the TrainResult with the metrics lines written."""
        result = self.train(config, out, **kw)
        return result, read_metrics(out / "metrics.jsonl")


FRAMEWORKS = ("torch", "jax")


@pytest.fixture(params=FRAMEWORKS)
def trainer(request: pytest.FixtureRequest) -> Trainer:
    """Each framework's trainer (outside any numerics context: a run sets up its own)."""
    return Trainer(request.param, importlib.import_module(f"ref_{request.param}.trainer"))


def each_trainer(argname: str, values: list[Any]) -> pytest.MarkDecorator:
    """Parametrize a test over `values` × both trainers, with ids like `hold[jax]`."""
    return pytest.mark.parametrize(("trainer", argname), [pytest.param(f, v, id=f"{v}[{f}]") for v in values
                                                          for f in FRAMEWORKS], indirect=["trainer"])


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cfg(base: dict, *overrides: str):
    return load_config(base, list(overrides))


def linear_config(**sections: Any) -> dict[str, Any]:
    """y = 3x + 2 with 48 training samples in micro-batches of 10: 5 per epoch, the last one of 8,
    so windows of 3 micro-batches are (3, 2): every epoch ends in an incomplete window."""
    base = {
        "model": {"name": "linear"},
        "data": {"name": "linear_regression", "batch_size": 10, "val_fraction": 0.25},
        "loss": {"name": "mse"},
        "optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.01},
        "schedule": {"name": "cosine", "t_max": 6},
        "accumulation": {"steps": 3},
        "precision": {"dtype": "float64"},
        "run": {"epochs": 3, "eval_every": 2, "progress": "none"},
        "checkpoint": {"every": 2},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


# SGD on y = 3x + 2, 8 updates over 2 epochs (float32: the default dtype)
LINEAR = {"model": {"name": "linear"}, "data": {"name": "linear_regression", "batch_size": 16},
          "loss": {"name": "mse"}, "optimizer": {"name": "sgd", "lr": 0.2}, "run": {"epochs": 2, "device": "cpu"}}
GPT_DROPOUT = {"model": {"name": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "dropout": 0.3},
               "data": {"name": "text", "batch_size": 4}, "run": {"max_updates": 6, "device": "cpu"}}


def _corpus(tmp: Path) -> Path:
    path = tmp / "corpus.txt"
    path.write_text(" ".join(np.random.default_rng(3).choice(["one", "two", "three", "four"], 200)))
    return path


def gpt_dropout(tmp: Path) -> dict[str, Any]:
    return dict(GPT_DROPOUT, data={**GPT_DROPOUT["data"], "path": str(_corpus(tmp))})


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
    with pytest.raises(TwinstepError, match=r"run.tensorboard = true needs the tensorboard package"):
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


# a world of 2 without a launcher: torch needs torchrun to join the ranks; JAX runs as one process
SEVERAL_PROCESSES = {"torch": (ConfigError, "torchrun"), "jax": (UnsupportedError, "one process")}


def test_several_processes_without_a_launcher_are_refused(trainer: Trainer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    error, match = SEVERAL_PROCESSES[trainer.name]
    with pytest.raises(error, match=match):
        trainer.train(cfg(LINEAR), tmp_path / "run", rank=0, world_size=2)


def test_cli_bad_value_is_one_line_without_traceback(trainer: Trainer, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "conformance", "train", "--backend", trainer.name, "--out",
                           str(tmp_path / "run"), "--set", "optimizer.betas=[0.9, 1.5]"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("twinstep: error: ") and "optimizer.betas[1]" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# the train cases and their negative controls
# ---------------------------------------------------------------------------------------------


def _case(name: str):
    return load_case(next(CASES.rglob(f"{name}.toml")))


@each_trainer("name", ["fp16-injected-overflows", "accumulation-incomplete-window"])
def test_train_cases_pass(trainer: Trainer, name: str) -> None:
    result = run_case(_case(name), Backend(trainer.name))
    assert result.passed, result.message


def _jax_steps_the_schedule_on_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    # the compiled step moves the schedule position itself (ref_jax._train_step): build it as if
    # schedule_on_skip were "advance"
    import ref_jax.trainer as jt

    real = jt.make_train_step

    def advancing(config: Any, *args: Any, **kw: Any) -> Any:
        precision = config.precision.model_copy(update={"schedule_on_skip": "advance"})
        return real(config.model_copy(update={"precision": precision}), *args, **kw)

    monkeypatch.setattr(jt, "make_train_step", advancing)


def test_schedule_stepped_on_skipped_updates_is_caught(trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PrecisionSpec, "schedule_advances", lambda self, skipped: True)
    if trainer.name == "jax":
        _jax_steps_the_schedule_on_skips(monkeypatch)
    result = run_case(_case("fp16-injected-overflows"), Backend(trainer.name))
    assert not result.passed and result.message.startswith(("final_params", "lr"))


def test_injection_ignored_is_caught(trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer.module, "injected", lambda config, t: False)
    result = run_case(_case("fp16-injected-overflows"), Backend(trainer.name))
    assert not result.passed


def _torch_divides_by_the_configured_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from ref_torch import _update

    real = _update.accumulate_gradients

    def uncorrected(spec, loss_fn, params, window, *args, **kwargs):
        n = len(window)

        def scaled(p, mb):
            out = loss_fn(p, mb)
            return out._replace(value=out.value * n / spec.steps)

        return real(spec, scaled, params, window, *args, **kwargs)

    monkeypatch.setattr(_update, "accumulate_gradients", uncorrected)


def _jax_divides_by_the_configured_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from ref_jax._window import WindowLayout

    real = WindowLayout.pad

    def padded_size(self, window, counts, inject=False):
        return {**real(self, window, counts, inject), "n": np.asarray(self.steps, self.real_dtype)}

    monkeypatch.setattr(WindowLayout, "pad", padded_size)


def test_incomplete_window_divided_by_the_configured_steps_is_caught(trainer: Trainer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-2024 accumulation bug: the last, shorter window divided by accumulation.steps (torch:
    seed 000's remainder correction left out; JAX: the padded window's size taken for its count)."""
    plant = {"torch": _torch_divides_by_the_configured_steps, "jax": _jax_divides_by_the_configured_steps}
    plant[trainer.name](monkeypatch)
    result = run_case(_case("accumulation-incomplete-window"), Backend(trainer.name))
    assert not result.passed


# ---------------------------------------------------------------------------------------------
# torch only: train/eval modes, torch.compile
# ---------------------------------------------------------------------------------------------


def test_torch_evaluation_that_leaves_eval_mode_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control of test_evaluation_does_not_disturb_training: an evaluation that forgets
    model.train() trains on without dropout, and the trajectory changes."""
    from ref_torch import trainer as tr

    base = gpt_dropout(tmp_path)
    quiet = tr.train(cfg(base, "run.eval_every=0"), tmp_path / "a", progress="none")
    real = tr._evaluate

    def stays_in_eval_mode(config, run_, model, device, dtype):
        out = real(config, run_, model, device, dtype)
        model.eval()
        return out

    monkeypatch.setattr(tr, "_evaluate", stays_in_eval_mode)
    broken = tr.train(cfg(base, "run.eval_every=1"), tmp_path / "c", progress="none")
    assert not all(np.array_equal(quiet.params[k], broken.params[k]) for k in quiet.params)


def test_torch_cuda_refusal_writes_nothing(tmp_path: Path) -> None:
    from ref_torch import trainer as tr

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="run.device = 'cuda'"):
        tr.train(cfg(LINEAR, "run.device=\"cuda\""), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.slow
def test_torch_compiled_model_trains_like_the_eager_one(tmp_path: Path) -> None:
    from ref_torch import trainer as tr

    eager = tr.train(cfg(LINEAR, "precision.dtype=\"float64\""), tmp_path / "a", progress="none")
    compiled = tr.train(cfg(LINEAR, "precision.dtype=\"float64\"", "run.compile=true"), tmp_path / "b",
                        progress="none")
    for k in eager.params:
        np.testing.assert_allclose(compiled.params[k], eager.params[k], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# JAX only: torch's initial weights, the padded window, one compiled step, the numerics context
# ---------------------------------------------------------------------------------------------


def train_jax(config: dict[str, Any], out: Path, **kw: Any) -> Any:
    from ref_jax.trainer import train

    return train(load_config(config), out, **kw)


def test_jax_initial_weights_are_the_torch_models() -> None:
    from ref_jax import _train_state as ts
    from ref_jax._parallel import placement
    from ref_torch.models import build_model, named_parameters

    config = load_config("configs/gpt_tiny.toml" if (ROOT / "configs/gpt_tiny.toml").exists() else None)
    data = DataPipeline(config)
    parts = ts.build(config, data.info, placement("cpu"), data.updates_per_epoch, data.planned_updates)
    model = build_model(config.model, data.info, seed=config.run.seed, dtype="float32")
    want = {k: p.detach().numpy() for k, p in named_parameters(model).items()}
    assert list(parts.params) == list(want)
    for k, v in want.items():
        np.testing.assert_array_equal(np.asarray(parts.params[k]), v, err_msg=k)
    for k, v in init_params(config.model, data.info, config.run.seed).items():
        np.testing.assert_array_equal(np.asarray(parts.params[k]), v.astype(np.float32), err_msg=k)


def _torch_window_grads(spec: AccumulationSpec, loss: LossSpec, params: dict, batches: list) -> tuple[dict, float]:
    from ref_torch.accumulation import accumulate_gradients, linear_forward
    from ref_torch.losses import compute_loss

    p = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params.items()}
    counts = [float((y != -100).sum()) for _, y in batches]
    tensors = [(torch.tensor(x), torch.tensor(y)) for x, y in batches]
    grads, out = accumulate_gradients(spec, lambda q, mb: compute_loss(loss, linear_forward(q, mb[0]), mb[1]),
                                      p, tensors, counts)
    return {k: g.numpy() for k, g in grads.items()}, float(out.loss)


def _jax_window_grads(spec: AccumulationSpec, loss: LossSpec, params: dict, batches: list, steps: int,
                      rows: int, n_override: float | None = None) -> tuple[dict, float]:
    import jax.numpy as jnp

    from conformance.data import Batch, Window
    from ref_jax._window import WindowLayout, masked_loss
    from ref_jax.accumulation import accumulate_gradients as window_grads
    from ref_jax.accumulation import linear_forward
    from ref_jax.losses import compute_loss

    window = Window(0, 0, 0, tuple(Batch(x, y, np.arange(len(y)), 0, j, len(y)) for j, (x, y) in enumerate(batches)),
                    sum(len(y) for _, y in batches))
    layout = WindowLayout(steps, rows, np.float64, np.int64, np.float64)
    arrays = layout.pad(window, [float((y != -100).sum()) for _, y in batches])
    if n_override is not None:
        arrays["n"] = np.asarray(n_override)

    def loss_fn(p: Any, mb: Any) -> Any:
        return masked_loss(loss, compute_loss(loss, linear_forward(p, mb["x"]), mb["y"], mask=mb["mask"]),
                           jnp.sum(mb["mask"]))

    with jax.enable_x64(True):
        grads, out = jax.jit(lambda p, w: window_grads(spec, loss_fn, p, w, None))(
            {k: jnp.asarray(v) for k, v in params.items()}, {k: jnp.asarray(v) for k, v in arrays.items()})
        return {k: np.asarray(g) for k, g in grads.items()}, float(out.loss)


def _window_data(sizes: list[int], seed: int = 0) -> tuple[dict, list]:
    rng = np.random.default_rng(seed)
    params = {"w": rng.normal(size=(3, 4)), "b": rng.normal(size=4) * 0.1}
    batches = []
    for n in sizes:
        y = rng.integers(0, 4, size=n)
        y[0] = -100  # an ignored target: unequal valid counts
        batches.append((rng.normal(size=(n, 3)), y))
    return params, batches


@pytest.mark.parametrize("normalize", ["micro_batches", "tokens"])
@pytest.mark.parametrize("sizes", [[6, 6, 6], [6, 6, 2], [6, 3], [5]], ids=["full", "short-last", "incomplete", "one"])
def test_jax_padded_window_equals_torch_accumulation(normalize: str, sizes: list[int]) -> None:
    spec, loss = AccumulationSpec(steps=3, normalize=normalize), LossSpec(name="cross_entropy")
    params, batches = _window_data(sizes)
    want, want_loss = _torch_window_grads(spec, loss, params, batches)
    got, got_loss = _jax_window_grads(spec, loss, params, batches, steps=3, rows=6)
    assert abs(got_loss - want_loss) <= 1e-12 * abs(want_loss)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-15, err_msg=k)


def test_jax_padded_window_check_catches_a_wrong_divisor() -> None:
    # negative control: dividing an incomplete window by the padded size (3) instead of its 2
    # micro-batches is exactly the bug the remainder correction exists for; the check sees it
    spec, loss = AccumulationSpec(steps=3), LossSpec(name="cross_entropy")
    params, batches = _window_data([6, 3])
    want, _ = _torch_window_grads(spec, loss, params, batches)
    got, _ = _jax_window_grads(spec, loss, params, batches, steps=3, rows=6, n_override=3.0)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got["w"], want["w"], rtol=1e-12, atol=1e-15)


def test_jax_compiles_one_step_and_donates_the_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ref_jax.trainer as jt

    seen: dict[str, Any] = {"donated": []}
    real = jt.make_train_step

    def spy(*args: Any, **kw: Any) -> Any:
        step = real(*args, **kw)
        seen["step"] = step

        def call(state: Any, *rest: Any) -> Any:
            leaves = jax.tree_util.tree_leaves_with_path(state)
            out = step(state, *rest)
            # every buffer is reused but the group hyper-parameters, which the step overwrites from
            # the schedule before reading them (an unused input is pruned, so not donated)
            kept = [jax.tree_util.keystr(p) for p, leaf in leaves if not leaf.is_deleted()]
            seen["donated"].append(all(".hyperparams[" in k for k in kept) and len(kept) < len(leaves) // 4)
            return out

        return call

    monkeypatch.setattr(jt, "make_train_step", spy)
    # epochs of windows (3, 2) whose last micro-batch has 8 of 10 rows: three shapes, one compile
    train_jax(linear_config(), tmp_path / "run")
    assert seen["step"]._cache_size() == 1
    assert seen["donated"] == [True] * 6  # every update reused the previous state's buffers


def test_jax_x64_only_inside_float64_runs(tmp_path: Path) -> None:
    assert not jax.config.jax_enable_x64
    before = jax.config.jax_default_matmul_precision
    r64 = train_jax(linear_config(run={"epochs": 1}), tmp_path / "f64")
    assert not jax.config.jax_enable_x64 and jax.config.jax_default_matmul_precision == before
    r32 = train_jax(linear_config(precision={"dtype": "float32"}, run={"epochs": 1}), tmp_path / "f32")
    assert r64.params["weight"].dtype == np.float64 and r32.params["weight"].dtype == np.float32
    assert abs(r32.losses[-1] - r64.losses[-1]) <= 1e-5 * abs(r64.losses[-1])
