"""Checkpoints cross frameworks: a torch checkpoint resumes in the JAX trainer and the continued run
is the torch run's continuation; a JAX checkpoint resumes in the torch trainer, likewise.

The run carries every kind of state across the switch: AdamW moments and per-parameter counts,
a cosine schedule held by a skipped update (the position is not the update count) with
[schedule.hyper] schedules of beta1 and the weight decay held with it, the dynamic
loss scale after a backoff, the skip counters, incomplete accumulation windows and an epoch
boundary. float64, so "the same trajectory" means ≤ 1e-10 relative (conformance.run.compare).
Negative control: a JAX resume that forgets the optimizer state, the loss scale or the schedule
position of a torch checkpoint fails the same comparison.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.resume import forgotten

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.run.compare import compare_runs, describe_failure

SPLIT, TOTAL = 5, 12
CONFIG = {
    "model": {"name": "mlp", "hidden": [12]},
    "data": {"name": "binary_blobs", "n_samples": 240, "batch_size": 30},  # 192 train: windows (3, 3, 1)
    "optimizer": {"name": "adamw", "lr": 1e-2, "weight_decay": 0.05},
    "schedule": {"name": "cosine", "t_max": TOTAL, "hyper": {  # beta1 warming up, decay following the lr
        "beta1": {"name": "linear", "start_factor": 0.5, "total_iters": 8}, "weight_decay": {"name": "cosine",
                                                                                             "t_max": TOTAL}}},
    "clip": {"max_norm": 0.5},
    "accumulation": {"steps": 3},
    "precision": {"dtype": "float64", "loss_scale": "dynamic", "init_scale": 256.0, "growth_interval": 2},
    "run": {"max_updates": TOTAL, "eval_every": 4, "device": "cpu", "progress": "none", "inject_nonfinite": [2]},
    "checkpoint": {"every": 0, "keep_last": 5},
}


@pytest.fixture(autouse=True, scope="module")
def xla_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A persistent compilation cache for this module's in-process runs: each resume of the same
    config loads the compiled step instead of compiling it again (the same executable, the same
    bits). Scoped to the module and reset afterwards."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                                 "jax_persistent_cache_min_compile_time_secs")}
    cc.reset_cache()
    cc.set_cache_dir(str(tmp_path_factory.mktemp("xla-cache")))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield
    cc.reset_cache()
    for k, v in saved.items():
        jax.config.update(k, v)


def trainer(name: str) -> Any:
    if name == "torch":
        from ref_torch.trainer import train
    else:
        from ref_jax.trainer import train
    return train


def config(updates: int) -> Any:
    return load_config({**CONFIG, "run": {**CONFIG["run"], "max_updates": updates}})


@pytest.fixture(scope="module")
def torch_full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("torch") / "full"
    trainer("torch")(config(TOTAL), out)
    return out


@pytest.fixture(scope="module")
def first_part(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The first SPLIT updates on each framework, ending in a checkpoint."""
    parts = {}
    for name in ("torch", "jax"):
        out = tmp_path_factory.mktemp(name) / "part"
        trainer(name)(config(SPLIT), out)
        parts[name] = out
    return parts


def continue_in(framework: str, part: Path, out: Path) -> Path:
    shutil.copytree(part, out)
    trainer(framework)(config(TOTAL), out, resume=True)
    return out


def assert_same_run(reference: Path, got: Path) -> None:
    result = compare_runs(reference, got)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    a = ck.load_checkpoint(reference / "checkpoints" / ck.step_name(TOTAL)).state
    b = ck.load_checkpoint(got / "checkpoints" / ck.step_name(TOTAL)).state
    for name, value in a.model.items():
        np.testing.assert_allclose(b.model[name], value, rtol=1e-10, atol=1e-12, err_msg=name)
    ca, cb = dict(a.meta["counters"]), dict(b.meta["counters"])
    assert cb.pop("best_val_loss") == pytest.approx(ca.pop("best_val_loss"), rel=1e-10)
    assert cb == ca and b.meta["loss_scale"] == a.meta["loss_scale"]


def test_the_split_carries_state(first_part: dict[str, Path]) -> None:
    # the checkpoint holds what must cross: a held schedule, a backed-off scale, optimizer moments
    meta = ck.load_checkpoint(first_part["torch"] / "checkpoints" / ck.step_name(SPLIT)).state.meta
    assert meta["counters"]["schedule_t"] == SPLIT - 1 and meta["counters"]["skipped_total"] == 1
    assert meta["loss_scale"]["scale"] != 256.0 and meta["optimizer_step"] == SPLIT - 1


def test_torch_checkpoint_continues_in_jax(torch_full: Path, first_part: dict[str, Path], tmp_path: Path) -> None:
    got = continue_in("jax", first_part["torch"], tmp_path / "run")
    assert ck.load_checkpoint(got / "checkpoints" / ck.step_name(TOTAL)).state.meta["backend"] == "jax"
    assert_same_run(torch_full, got)


def test_jax_checkpoint_continues_in_torch(torch_full: Path, first_part: dict[str, Path], tmp_path: Path) -> None:
    got = continue_in("torch", first_part["jax"], tmp_path / "run")
    assert ck.load_checkpoint(got / "checkpoints" / ck.step_name(TOTAL)).state.meta["backend"] == "torch"
    assert_same_run(torch_full, got)


@pytest.mark.parametrize("forget", ["optimizer", "loss_scale", "schedule"])
def test_jax_resume_that_forgets_state_fails(torch_full: Path, first_part: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch, forget: str) -> None:
    from conformance.run import (
        session,  # forgotten after verification, as by the trainer
    )

    real_pick = session.pick_checkpoint
    monkeypatch.setattr(session, "pick_checkpoint", lambda *a, **k: forgotten(real_pick(*a, **k), forget))
    got = continue_in("jax", first_part["torch"], tmp_path / "run")
    assert not compare_runs(torch_full, got).passed
