"""Your own model and your own data, one test body per trainer (`[torch]`, `[jax]`):
a torch nn.Module and a Flax NNX module twinstep does not ship, trained from NumPy arrays through
`train(config, out, model=..., data=...)`, learn; data passed in trains exactly as the same data
set named in the config (one pipeline, one protocol); a loss_fn returning (sum, count) trains as
`[loss]` does under both normalizations; buffers and NNX state are checkpointed under neutral
names (renamed by `[model] rename`); configs that name a built-in model or data set and are given
one are refused naming both. Exact resume after SIGKILL: tests/test_user_resume.py; torchrun:
tests/test_user_parallel.py; torch and NNX twins compared: tests/test_user_cross.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.resume import VOLATILE
from support.trainers import FRAMEWORKS, Trainer, each_trainer
from support.user_models import blobs, cross_entropy_sum, model

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.data import DataPipeline
from conformance.errors import CheckpointError, ConfigError, InputError
from conformance.run.compare import compare_runs, describe_failure
from conformance.run.metrics import read_metrics
from conformance.run.validate import validate_state

pytestmark = pytest.mark.usefixtures("one_thread")

LEARN = {"data": {"batch_size": 32, "val_fraction": 0.2}, "optimizer": {"name": "adamw", "lr": 2e-2},
         "run": {"max_updates": 60, "eval_every": 60, "device": "cpu"}}


def lines(out: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in read_metrics(out / "metrics.jsonl")]


def test_own_model_on_arrays_learns(trainer: Trainer, tmp_path: Path) -> None:
    result, records = trainer.run(LEARN, tmp_path / "run", model=model(trainer.name), data=blobs())
    first, last = np.mean(result.losses[:3]), np.mean(result.losses[-5:])
    assert last <= first / 2, (first, last)
    assert records[-1]["event"] == "eval" and records[-1]["val_accuracy"] > 0.85
    assert "bn.bias" in result.params and "fc1.weight" in result.params or "fc1.kernel" in result.params
    saved = load_config(tmp_path / "run" / "config.toml")
    assert (saved.model.name, saved.data.name) == ("user", "user")


def test_jax_pure_form_learns(tmp_path: Path) -> None:
    """The documented pure form for linen / hand-written models: (apply_fn, params pytree)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    params = {"hidden": {"w": rng.standard_normal((8, 16)).astype(np.float32) * 0.3, "b": np.zeros(16, np.float32)},
              "out": [rng.standard_normal((16, 3)).astype(np.float32) * 0.3]}

    def apply(p: Any, x: Any) -> Any:
        return jnp.tanh(x @ p["hidden"]["w"] + p["hidden"]["b"]) @ p["out"][0]

    from ref_jax.trainer import train

    result = train(load_config(LEARN), tmp_path / "run", model=(apply, params), data=blobs(), progress="none")
    assert sorted(result.params) == ["hidden.b", "hidden.w", "out.0"]
    assert np.mean(result.losses[-5:]) <= np.mean(result.losses[:3]) / 2


@each_trainer("case", ["model", "data", "user-model", "user-data"])
def test_naming_a_builtin_and_passing_one_is_refused(trainer: Trainer, tmp_path: Path, case: str) -> None:
    given = {"model": dict(model=model(trainer.name)), "data": dict(data=blobs()), "user-model": {},
             "user-data": dict(model=model(trainer.name))}[case]
    config = {"model": {"name": "mlp"}} if case == "model" else {"data": {"name": "digits"}} if case == "data" \
        else {"model": {"name": "user"}} if case == "user-model" else {"data": {"name": "user"}}
    want = {"model": "model.name = 'mlp' names a built-in model, and train() was also given model=",
            "data": "data.name = 'digits' names a data set, and train() was also given data=",
            "user-model": "model.name = 'user' is a model passed to train(..., model=...)",
            "user-data": "data.name = 'user' is data passed to train(..., data=...)"}[case]
    with pytest.raises(ConfigError) as err:
        trainer.train(config, tmp_path / "run", **given)
    assert str(err.value).startswith(want), err.value
    assert not (tmp_path / "run").exists()


def test_own_model_on_builtin_data_and_builtin_model_on_own_data(trainer: Trainer, tmp_path: Path) -> None:
    short = {"run": {"max_updates": 4, "eval_every": 0, "device": "cpu"}}
    mine = trainer.train({**short, "data": {"name": "binary_blobs", "n_samples": 200}}, tmp_path / "a",
                         model=_blob_model(trainer.name))
    builtin = trainer.train({**short, "model": {"name": "mlp", "hidden": [8]}}, tmp_path / "b", data=blobs())
    assert len(mine.losses) == len(builtin.losses) == 4
    assert builtin.params["0.weight"].shape == (8, 8) and builtin.params["3.weight"].shape == (3, 8)


def _blob_model(framework: str) -> Any:  # 20 features, 2 classes: the built-in binary_blobs
    if framework == "torch":
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(20, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    from flax import nnx

    return nnx.Sequential(nnx.Linear(20, 4, rngs=nnx.Rngs(0)), nnx.tanh, nnx.Linear(4, 2, rngs=nnx.Rngs(1)))


class Held:
    """A user's map-style data set of its own kind (not a mapping): len, take, fingerprint."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y
        self.fingerprint = f"held-{len(x)}"

    def __len__(self) -> int:
        return len(self.x)

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {"x": self.x[index], "y": self.y[index]}


@each_trainer("form", ["mapping", "object"])
def test_data_passed_in_trains_as_the_data_set_named(trainer: Trainer, tmp_path: Path, form: str) -> None:
    """One mechanism: the built-in digits named in [data], and digits' own train/validation arrays
    passed as data (a mapping, or a MapData object of the user's), give the same run, bit for bit."""
    base = {"model": {"name": "mlp", "hidden": [16], "out_features": 10}, "data": {"batch_size": 50},
            "accumulation": {"steps": 2}, "run": {"max_updates": 6, "eval_every": 3, "device": "cpu"}}
    named = {**base, "data": {**base["data"], "name": "digits"}}
    ref = trainer.train(named, tmp_path / "named")
    ds = DataPipeline(load_config(named)).dataset
    whole = [s.take(np.arange(len(s))) for s in (ds.train, ds.val)]
    pair = tuple(w if form == "mapping" else Held(w["x"], w["y"]) for w in whole)
    got = trainer.train(base, tmp_path / "given", data=pair)
    assert lines(tmp_path / "named") == lines(tmp_path / "given")
    for k in ref.params:
        np.testing.assert_array_equal(got.params[k], ref.params[k], err_msg=k)


def _loss_config(normalize: str) -> dict[str, Any]:
    # 190 training samples, batch 25, accumulation 3: windows of (25, 25, 25) and (25, 15) samples,
    # so micro_batches (mean of micro-batch means) and tokens (the full-batch mean) differ
    return {"data": {"batch_size": 25, "val_fraction": 0.05}, "optimizer": {"name": "adamw", "lr": 1e-2},
            "accumulation": {"steps": 3, "normalize": normalize}, "precision": {"dtype": "float64"},
            "run": {"max_updates": 8, "eval_every": 4, "device": "cpu"}}


def _mean_not_sum(framework: str) -> Any:
    real = cross_entropy_sum(framework)

    def wrong(out: Any, batch: Any) -> Any:  # the mean with a count of 1: normalized twice over
        total, count = real(out, batch)
        return total / count, 1

    return wrong


@each_trainer("normalize", ["micro_batches", "tokens"])
def test_loss_fn_trains_as_the_loss_section(trainer: Trainer, tmp_path: Path, normalize: str) -> None:
    config = _loss_config(normalize)
    data = blobs(n=200, dtype=np.float64)
    trainer.train(config, tmp_path / "section", model=model(trainer.name, "plain"), data=data)
    trainer.train(config, tmp_path / "fn", model=model(trainer.name, "plain"), data=data,
                  loss_fn=cross_entropy_sum(trainer.name))
    result = compare_runs(tmp_path / "section", tmp_path / "fn")
    assert result.passed, describe_failure(result)
    if normalize == "tokens":  # negative control: a loss_fn that returns (mean, 1) is caught
        trainer.train(config, tmp_path / "wrong", model=model(trainer.name, "plain"), data=data,
                      loss_fn=_mean_not_sum(trainer.name))
        assert not compare_runs(tmp_path / "section", tmp_path / "wrong").passed


def test_buffers_and_state_are_checkpointed_under_renamed_names(trainer: Trainer, tmp_path: Path) -> None:
    own = {"torch": "fc1.weight", "jax": "fc1.kernel"}[trainer.name]
    config = {**LEARN, "model": {"name": "user", "rename": {own: "first.weight"}},
              "run": {"max_updates": 3, "eval_every": 0, "device": "cpu"}}
    result = trainer.train(config, tmp_path / "run", model=model(trainer.name), data=blobs())
    saved = ck.load_checkpoint(ck.find_latest(tmp_path / "run" / "checkpoints")).state
    state = {"torch": {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"},
             "jax": {"bn.mean", "bn.var", "drop.rngs.key", "drop.rngs.count"}}[trainer.name]
    assert state <= set(saved.model) and "first.weight" in saved.model and own not in saved.model
    assert "first.weight" in saved.optimizer and "first.weight" in result.params
    assert not state & set(result.params)  # TrainResult.params: parameters only
    # a resume's validation accepts the state beside the parameters (no optimizer state for it) ...
    found = ck.load_checkpoint(ck.find_latest(tmp_path / "run" / "checkpoints"))
    validate_state(found)
    # ... and refuses optimizer state for a tensor the model does not have (negative control)
    wrong = found._replace(state=found.state._replace(optimizer={**found.state.optimizer,
                                                                 "ghost.weight": found.state.optimizer["first.weight"]}))
    with pytest.raises(CheckpointError, match="ghost.weight"):
        validate_state(wrong)
    with pytest.raises(ConfigError, match="model.rename: 'fc9.weight' names nothing in this model"):
        trainer.train({**config, "model": {"name": "user", "rename": {"fc9.weight": "x"}}}, tmp_path / "bad",
                      model=model(trainer.name), data=blobs())


def test_bad_data_is_one_line_naming_it(trainer: Trainer, tmp_path: Path) -> None:
    data = blobs()
    cases = [({"x": data["x"], "y": data["y"][:-1]}, "data: entries must share their first axis"),
             ({"x": data["x"], "label": data["y"]}, "data.targets = 'y', but the data's entries are ['label', 'x']"),
             ([1, 2, 3], "data must be a mapping of NumPy arrays with a common first axis, or an object"),
             ({"x": data["x"], "y": data["y"], "sample_mask": data["y"]}, "data: the entry 'sample_mask' is reserved")]
    for bad, message in cases:
        with pytest.raises(InputError) as err:
            trainer.train(LEARN, tmp_path / "run", model=model(trainer.name), data=bad)
        assert str(err.value).startswith(message), err.value
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_user_model_under_autocast_and_loss_scaling(tmp_path: Path, dtype: str) -> None:
    from ref_torch.trainer import train

    config = load_config({**LEARN, "precision": {"dtype": dtype}, "run": {"max_updates": 20, "eval_every": 0,
                                                                          "device": "cpu"}})
    result = train(config, tmp_path / "run", model=model("torch"), data=blobs(), progress="none")
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["event"] == "update"]
    assert all(np.isfinite(result.losses)) and result.losses[-1] < result.losses[0]
    assert (records[0]["loss_scale"] is not None) == (dtype == "float16")


def test_jax_user_model_with_dynamic_loss_scaling(tmp_path: Path) -> None:
    from ref_jax.trainer import train

    config = load_config({**LEARN, "precision": {"loss_scale": "dynamic", "init_scale": 2.0 ** 20},
                          "run": {"max_updates": 12, "eval_every": 0, "device": "cpu", "inject_nonfinite": [2]}})
    result = train(config, tmp_path / "run", model=model("jax"), data=blobs(), progress="none")
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["event"] == "update"]
    assert [r["skipped"] for r in records[:4]] == [False, False, True, False]
    assert records[3]["loss_scale"] == 2.0 ** 19 and result.losses[-1] < result.losses[0]


def test_torch_compiled_user_model_trains_like_the_eager_one(tmp_path: Path) -> None:
    from ref_torch.trainer import train

    config = {**_loss_config("micro_batches"), "run": {"max_updates": 3, "eval_every": 0, "device": "cpu"}}
    data = blobs(n=200, dtype=np.float64)
    eager = train(load_config(config), tmp_path / "a", model=model("torch", "plain"), data=data, progress="none")
    compiled = train(load_config(config, ["run.compile=true"]), tmp_path / "b", model=model("torch", "plain"),
                     data=data, progress="none")
    for k in eager.params:
        np.testing.assert_allclose(compiled.params[k], eager.params[k], rtol=1e-12, err_msg=k)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_language_data_of_a_user_reports_tokens_per_s(tmp_path: Path, framework: str) -> None:
    """Integer targets with a sequence axis are a language model's: tokens/s counts positions."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, size=(64, 9))
    data = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
    if framework == "torch":
        import torch

        torch.manual_seed(0)
        net: Any = torch.nn.Sequential(torch.nn.Embedding(5, 8), torch.nn.Linear(8, 5))
    else:
        from flax import nnx

        net = nnx.Sequential(nnx.Embed(5, 8, rngs=nnx.Rngs(0)), nnx.Linear(8, 5, rngs=nnx.Rngs(1)))
    import importlib

    train = importlib.import_module(f"ref_{framework}.trainer").train
    train(load_config({"data": {"batch_size": 16}, "run": {"max_updates": 3, "eval_every": 0, "device": "cpu"}}),
          tmp_path / "run", model=net, data=data, progress="none")
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(r["tokens_per_s"] > 0 and "mfu" not in r for r in records)


def test_mfu_uses_the_flops_per_token_given() -> None:
    from types import SimpleNamespace

    from conformance.run.throughput import throughput_extras

    config = load_config({"model": {"name": "user", "flops_per_token": 1e9}, "data": {"name": "user"}})
    info = SimpleNamespace(task="language_model", block_size=8)
    run = SimpleNamespace(data=SimpleNamespace(info=info), world_size=1)
    window = SimpleNamespace(global_samples=100)
    out = throughput_extras(config, run, window, 1.0, "NVIDIA H100 80GB HBM3")
    assert out["tokens_per_s"] == 800 and out["mfu"] == pytest.approx(800 * 1e9 / 989e12)
    bare = load_config({"model": {"name": "user"}, "data": {"name": "user"}})
    assert "mfu" not in throughput_extras(bare, run, window, 1.0, "NVIDIA H100 80GB HBM3")
