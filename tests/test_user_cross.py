"""Your own model on both frameworks: the same CNN written in torch and in Flax NNX
(tests/support/cnn_twins.py: the NNX twin keeps torch's layouts and names its classifier `head`,
mapped to torch's `fc` by `[model] rename`), trained on the bundled digits from the same initial
weights, agrees update by update (`twinstep compare` at float64's run tolerance, 1e-10), and a
checkpoint of either resumes on the other: the continued run is the torch run's continuation.
Negative control: an NNX twin that max-pools where torch average-pools fails the comparison.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cnn_twins import RENAME, twins

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.run.compare import compare_runs, describe_failure

pytestmark = pytest.mark.usefixtures("one_thread")
SPLIT, TOTAL = 6, 12
CONFIG = {"model": {"name": "user", "rename": RENAME}, "data": {"name": "digits", "batch_size": 64},
          "optimizer": {"name": "adamw", "lr": 1e-2}, "schedule": {"name": "cosine", "t_max": TOTAL},
          "clip": {"max_norm": 1.0}, "accumulation": {"steps": 2}, "precision": {"dtype": "float64"},
          "run": {"max_updates": TOTAL, "eval_every": 4, "device": "cpu"}, "checkpoint": {"every": SPLIT}}


def train(framework: str, out: Path, model: Any, updates: int = TOTAL, **kw: Any) -> Any:
    config = load_config(CONFIG, [f"run.max_updates={updates}"])
    return importlib.import_module(f"ref_{framework}.trainer").train(config, out, model=model, progress="none", **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both frameworks' whole runs from the same initial weights."""
    tmp = tmp_path_factory.mktemp("cnn")
    t, j = twins()
    train("torch", tmp / "torch", t)
    train("jax", tmp / "jax", j)
    return {"torch": tmp / "torch", "jax": tmp / "jax"}


def assert_same_run(reference: Path, got: Path) -> None:
    result = compare_runs(reference, got)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    a = ck.load_checkpoint(reference / "checkpoints" / ck.step_name(TOTAL)).state.model
    b = ck.load_checkpoint(got / "checkpoints" / ck.step_name(TOTAL)).state.model
    assert set(a) == set(b) == {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"}
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_torch_and_nnx_twins_agree_update_by_update(runs: dict[str, Path]) -> None:
    assert_same_run(runs["torch"], runs["jax"])


@pytest.mark.parametrize(("first", "then"), [("torch", "jax"), ("jax", "torch")])
def test_a_checkpoint_continues_on_the_other_framework(runs: dict[str, Path], tmp_path: Path, first: str,
                                                        then: str) -> None:
    out = tmp_path / "run"
    shutil.copytree(runs[first], out)
    for update, path in ck.list_checkpoints(out / "checkpoints"):
        if update > SPLIT:
            shutil.rmtree(path)
    t, j = twins(seed=1)  # other initial weights: the checkpoint's must win
    train(then, out, t if then == "torch" else j, resume=True)
    assert ck.load_checkpoint(out / "checkpoints" / ck.step_name(TOTAL)).state.meta["backend"] == then
    assert_same_run(runs["torch"], out)


def test_a_twin_that_differs_fails_the_comparison(runs: dict[str, Path], tmp_path: Path) -> None:
    _, wrong = twins(pool="max")
    train("jax", tmp_path / "wrong", wrong, updates=TOTAL)
    result = compare_runs(runs["torch"], tmp_path / "wrong")
    assert not result.passed and result.first_failure is not None and result.first_failure.update == 0
