"""The JAX trainer on its own: files and metrics as docs/contract.md §5 says, torch's initial weights,
one compiled and donating step whose padded windows equal torch's unpadded accumulation, the
numerics context scoped to the run, and one-line errors.

Runs are tiny (the linear model compiles in about a second); cross-framework equality of whole runs
is tests/test_cross_framework.py, resume tests/test_resume_kill_jax.py and test_cross_resume.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import torch

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.errors import CheckpointError, ConfigError, UnsupportedError
from conformance.models import init_params
from conformance.run.metrics import EVAL_KEYS, UPDATE_KEYS, read_metrics, updates

ROOT = Path(__file__).resolve().parents[1]


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


def train_jax(config: dict[str, Any], out: Path, **kw: Any) -> Any:
    from ref_jax.trainer import train

    return train(load_config(config), out, **kw)


# ---------------------------------------------------------------------------------------------
# files, metrics and checkpoints
# ---------------------------------------------------------------------------------------------


def test_run_writes_the_contract_files(tmp_path: Path) -> None:
    result = train_jax(linear_config(), tmp_path / "run")
    out = tmp_path / "run"
    assert result.updates_done == 6 and len(result.losses) == 6
    assert load_config(out / "config.toml") == load_config(linear_config())
    records = read_metrics(out / "metrics.jsonl")
    ups = updates(records)
    assert [r["update"] for r in ups] == list(range(6))
    for r in ups:
        assert set(UPDATE_KEYS) <= set(r) and len(r["lr"]) == 1 and r["loss_scale"] is None
    assert [r["samples_seen"] for r in ups] == [30, 48, 78, 96, 126, 144]
    evs = [r for r in records if r["event"] == "eval"]
    assert [r["update"] for r in evs] == [1, 3, 5] and all(set(EVAL_KEYS) <= set(r) for r in evs)
    assert sorted(u for u, _ in ck.list_checkpoints(out / "checkpoints")) == [4, 6]  # keep_last = 2
    state = ck.load_checkpoint(out / "checkpoints" / ck.step_name(6)).state
    assert set(state.model) == {"weight", "bias"} and state.model["weight"].dtype == np.float64
    for name in ("weight", "bias"):  # docs/contract.md §4: adamw's neutral names and a per-parameter count
        assert set(state.optimizer[name]) == {"m", "v", "step"} and int(state.optimizer[name]["step"]) == 6
        np.testing.assert_array_equal(state.model[name], result.params[name])
    assert state.meta["backend"] == "jax" and state.meta["optimizer_step"] == 6
    assert state.meta["counters"]["schedule_t"] == 6 and state.meta["data"]["updates_done"] == 6
    assert "rank0/jax_key" in state.rng and "rank0/numpy_global" in state.rng


def test_initial_weights_are_the_torch_models(tmp_path: Path) -> None:
    from conformance.data import DataPipeline
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


# ---------------------------------------------------------------------------------------------
# the padded window: torch's unpadded accumulation, at one compiled shape
# ---------------------------------------------------------------------------------------------


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
def test_padded_window_equals_torch_accumulation(normalize: str, sizes: list[int]) -> None:
    spec, loss = AccumulationSpec(steps=3, normalize=normalize), LossSpec(name="cross_entropy")
    params, batches = _window_data(sizes)
    want, want_loss = _torch_window_grads(spec, loss, params, batches)
    got, got_loss = _jax_window_grads(spec, loss, params, batches, steps=3, rows=6)
    assert abs(got_loss - want_loss) <= 1e-12 * abs(want_loss)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-15, err_msg=k)


def test_padded_window_check_catches_a_wrong_divisor() -> None:
    # negative control: dividing an incomplete window by the padded size (3) instead of its 2
    # micro-batches is exactly the bug the remainder correction exists for; the check sees it
    spec, loss = AccumulationSpec(steps=3), LossSpec(name="cross_entropy")
    params, batches = _window_data([6, 3])
    want, _ = _torch_window_grads(spec, loss, params, batches)
    got, _ = _jax_window_grads(spec, loss, params, batches, steps=3, rows=6, n_override=3.0)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got["w"], want["w"], rtol=1e-12, atol=1e-15)


def test_one_compiled_step_with_donated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


# ---------------------------------------------------------------------------------------------
# numerics context and precision
# ---------------------------------------------------------------------------------------------


def test_x64_only_inside_float64_runs(tmp_path: Path) -> None:
    assert not jax.config.jax_enable_x64
    before = jax.config.jax_default_matmul_precision
    r64 = train_jax(linear_config(run={"epochs": 1}), tmp_path / "f64")
    assert not jax.config.jax_enable_x64 and jax.config.jax_default_matmul_precision == before
    r32 = train_jax(linear_config(precision={"dtype": "float32"}, run={"epochs": 1}), tmp_path / "f32")
    assert r64.params["weight"].dtype == np.float64 and r32.params["weight"].dtype == np.float32
    assert abs(r32.losses[-1] - r64.losses[-1]) <= 1e-5 * abs(r64.losses[-1])


def test_bfloat16_policy_keeps_float32_master_weights(tmp_path: Path) -> None:
    cfg = linear_config(precision={"dtype": "bfloat16"}, run={"epochs": 2})
    low = train_jax(cfg, tmp_path / "bf16")
    ref = train_jax(linear_config(precision={"dtype": "float32"}, run={"epochs": 2}), tmp_path / "f32")
    assert low.params["weight"].dtype == np.float32
    lines = updates(read_metrics(tmp_path / "bf16/metrics.jsonl"))
    assert all(r["loss_scale"] is None and not r["skipped"] for r in lines)
    # bfloat16 compute (8 significant bits) vs float32 over 4 updates
    np.testing.assert_allclose(low.losses, ref.losses, rtol=2e-2)
    assert low.losses != ref.losses  # the policy really computed in bfloat16


# ---------------------------------------------------------------------------------------------
# errors: one line, the shared classes
# ---------------------------------------------------------------------------------------------


def test_several_processes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="one process"):
        train_jax(linear_config(), tmp_path / "run", rank=0, world_size=2)


@pytest.mark.skipif(any(d.platform == "gpu" for d in jax.devices()), reason="this machine has a GPU")
def test_cuda_without_a_gpu_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run.device = 'cuda' but JAX sees no GPU"):
        train_jax(linear_config(run={"device": "cuda"}), tmp_path / "run")


def test_existing_checkpoints_need_resume(tmp_path: Path) -> None:
    train_jax(linear_config(run={"epochs": 1}), tmp_path / "run")
    with pytest.raises(CheckpointError, match="pass --resume"):
        train_jax(linear_config(run={"epochs": 1}), tmp_path / "run")


def test_cli_bad_value_is_one_line_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "conformance", "train", "--backend", "jax", "--out",
                           str(tmp_path / "run"), "--set", "optimizer.betas=[0.9, 1.5]"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("twinstep: error: ") and "optimizer.betas[1]" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
