"""What only one trainer has: torch's train/eval modes, its CUDA refusal and torch.compile; JAX's
torch-equal initial weights, padded windows (equal to torch's accumulation), the one compiled and
donating step, and 64-bit types scoped to float64 runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import torch
from support.trainers import LINEAR, ROOT, cfg, gpt_dropout, linear_config

from conformance.config import load_config
from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.data import DataPipeline
from conformance.errors import (
    ConfigError,
)
from conformance.rules.models import init_params

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# torch only: train/eval modes, torch.compile
# ---------------------------------------------------------------------------------------------


def test_torch_evaluation_that_leaves_eval_mode_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control of test_evaluation_does_not_disturb_training: an evaluation that forgets
    model.train() trains on without dropout, and the trajectory changes."""
    from ref_torch import _steps
    from ref_torch import trainer as tr

    base = gpt_dropout(tmp_path)
    quiet = tr.train(cfg(base, "run.eval_every=0"), tmp_path / "a", progress="none")
    real = _steps._evaluate

    def stays_in_eval_mode(config, run_, model, device, dtype, *rest):
        out = real(config, run_, model, device, dtype, *rest)
        model.eval()
        return out

    monkeypatch.setattr(_steps, "_evaluate", stays_in_eval_mode)
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
    layout = WindowLayout(steps, rows, np.float64)
    arrays = layout.pad(window, [float((y != -100).sum()) for _, y in batches])
    if n_override is not None:
        arrays["n"] = np.asarray(n_override)

    def loss_fn(p: Any, mb: Any) -> Any:
        return masked_loss(loss, compute_loss(loss, linear_forward(p, mb["data"]["x"]), mb["data"]["y"],
                                              mask=mb["mask"]), jnp.sum(mb["mask"]))

    with jax.enable_x64(True):
        grads, out = jax.jit(lambda p, w: window_grads(spec, loss_fn, p, w, None))(
            {k: jnp.asarray(v) for k, v in params.items()}, jax.tree.map(jnp.asarray, arrays))
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
    import ref_jax._steps as jt  # the trainer's framework steps build the compiled step

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
