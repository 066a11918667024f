"""Shared by the trainer tests: both frameworks' trainers behind one interface, and small configs."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

from conformance.config import load_config
from conformance.run.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for in-process runs (tiny ops; 2 shared cores)."""
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




@pytest.fixture(scope="module")
def persistent_xla_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A persistent JAX compilation cache for one module's in-process runs: a second run of the same
    config loads the compiled step instead of compiling it again (the same executable, the same
    bits). Reset afterwards. (tests/test_resume_kill.py keeps its own, shared with subprocesses.)"""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    saved = {k: getattr(jax.config, k) for k in ("jax_compilation_cache_dir",
                                                 "jax_persistent_cache_min_compile_time_secs")}
    cache = tmp_path_factory.mktemp("xla") / "xla-cache"
    cc.reset_cache()
    cc.set_cache_dir(str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield cache
    cc.reset_cache()
    for k, v in saved.items():
        jax.config.update(k, v)
