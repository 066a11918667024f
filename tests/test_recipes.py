"""nanoGPT's character-level Shakespeare as twinstep configs, on the corpus twinstep ships.

- the built-in corpus (data.corpus = "tinyshakespeare"): karpathy/char-rnn's text, 65 characters,
  split as nanoGPT's data/shakespeare_char/prepare.py splits it; its checksum guards it (control);
- configs/shakespeare_char_cpu.toml and shakespeare_char.toml state nanoGPT's hyper-parameters:
  the lr of every update is nanoGPT's get_lr (hand-written below from train.py), decay applies to
  the tensors of two or more dimensions only (configure_optimizers);
- run.eval_batches: a fixed, seeded subset of validation batches, the same on every rank, backend
  and evaluation and across a resume; its loss is the mean over those batches' tokens (computed
  here with F.cross_entropy on the final weights); a different seed draws another (control);
- the CPU recipe trains on both trainers, which agree.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.lm import mean_token_loss

from conformance.config import load_config
from conformance.data import DataPipeline, builtin_corpus
from conformance.data import datasets as ds_mod
from conformance.errors import ConfigError, InputError
from conformance.oracle.schedules import lr_function
from conformance.run.metrics import evals, read_metrics, updates
from ref_torch.models import build_model
from ref_torch.optimizers import build_optimizer

ROOT = Path(__file__).resolve().parents[1]
CPU, GPU = ROOT / "configs" / "shakespeare_char_cpu.toml", ROOT / "configs" / "shakespeare_char.toml"
N_CHARS = 1_115_394


def nanogpt_lr(it: int, lr: float, warmup: int, decay_iters: int, min_lr: float) -> float:
    """nanoGPT train.py's get_lr."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


# --- the corpus ------------------------------------------------------------------------------------


def test_tinyshakespeare_is_the_char_rnn_text_split_as_nanogpt_splits_it() -> None:
    text = builtin_corpus("tinyshakespeare")
    assert len(text) == N_CHARS and text.startswith("First Citizen:\nBefore we proceed any further")
    data = DataPipeline(load_config(CPU)).dataset
    assert data.info.vocab == tuple(sorted(set(text))) and len(data.info.vocab) == 65  # prepare.py's vocab
    n_train = int(N_CHARS * 0.9)  # prepare.py: data[:int(n*0.9)], data[int(n*0.9):]
    assert len(data.train.tokens) == n_train and len(data.val.tokens) == N_CHARS - n_train
    lookup = {ch: i for i, ch in enumerate(sorted(set(text)))}
    assert [lookup[ch] for ch in text[n_train:n_train + 50]] == data.val.tokens[:50].tolist()


def test_the_corpus_checksum_guards_the_asset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds_mod, "TINYSHAKESPEARE_SHA256", "0" * 64)  # negative control: a wrong digest
    with pytest.raises(InputError, match="tinyshakespeare.txt.gz does not match"):
        builtin_corpus("tinyshakespeare")


@pytest.mark.parametrize(("data", "match"), [
    ({"name": "text", "corpus": "tinyshakespeare", "path": "x.txt"}, "data.corpus"),
    ({"name": "digits", "corpus": "tinyshakespeare"}, "corpus"),
    ({"name": "text", "corpus": "shakespeare"}, "corpus"),
])
def test_corpus_misuse_is_one_config_error(data: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config({"data": data})


def train(backend: str, config: Any, out: Path, **kw: Any) -> Any:
    module = importlib.import_module(f"ref_{backend}.trainer")
    return module.train(config, out, progress="none", **kw)


# --- the recipes' hyper-parameters -------------------------------------------------------------------


@pytest.mark.parametrize(("path", "decay_iters"), [(CPU, 2000), (GPU, 5000)])
def test_every_update_applies_nanogpts_lr(path: Path, decay_iters: int) -> None:
    config = load_config(path)
    lr = lr_function(config.schedule, config.optimizer.lr)
    for it in (0, 1, 50, 99, 100, 101, 1000, decay_iters - 1, decay_iters, decay_iters + 500):
        assert float(lr(np.asarray(it))) == pytest.approx(nanogpt_lr(it, 1e-3, 100, decay_iters, 1e-4), rel=1e-12)


@pytest.mark.parametrize("path", [CPU, GPU])
def test_weight_decay_applies_to_tensors_of_two_or_more_dimensions(path: Path) -> None:
    config = load_config(path)
    data = DataPipeline(config).info
    model = build_model(config.model, data)
    optimizer = build_optimizer(config.optimizer, model.named_parameters())
    decayed = {n for g in optimizer.param_groups if g["weight_decay"] == 0.1 for n in g["param_names"]}
    kept = {n for g in optimizer.param_groups if g["weight_decay"] == 0.0 for n in g["param_names"]}
    assert decayed == {n for n, p in model.named_parameters() if p.dim() >= 2}  # configure_optimizers
    assert kept == {n for n, p in model.named_parameters() if p.dim() < 2} and kept


def test_the_cpu_recipe_is_nanogpts_readme_run() -> None:
    c = load_config(CPU)
    assert (c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.block_size, c.model.dropout,
            c.model.bias) == (4, 4, 128, 64, 0.0, False)
    assert (c.data.batch_size, c.accumulation.steps, c.run.max_updates, c.run.eval_batches) == (12, 1, 2000, 20)
    assert (c.optimizer.lr, tuple(c.optimizer.betas), c.optimizer.weight_decay, c.clip.max_norm) == \
        (1e-3, (0.9, 0.99), 0.1, 1.0)


# --- run.eval_batches ---------------------------------------------------------------------------------


def tiny(**run: Any) -> dict[str, Any]:
    return {"model": {"name": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "bias": False},
            "data": {"name": "text", "corpus": "tinyshakespeare", "batch_size": 8},
            "optimizer": {"name": "adamw", "lr": 1e-3}, "checkpoint": {"every": 0, "at_end": False},
            "run": {"max_updates": 6, "eval_every": 3, "seed": 5, **run}}


def test_the_subset_is_fixed_shared_by_ranks_and_drawn_from_the_seed() -> None:
    one = DataPipeline(load_config(tiny(eval_batches=7)))
    total = -(-len(one.dataset.val) // 8)
    subset = one.eval_subset()
    assert len(subset) == 7 and subset == sorted(set(subset)) and 0 <= subset[0] and subset[-1] < total
    assert one.eval_subset() == subset  # every evaluation
    assert [b.micro_batch for b in one.val_batches()] == subset
    ranks = [DataPipeline(load_config(tiny(eval_batches=7)), rank=r, world_size=2).eval_subset() for r in (0, 1)]
    assert ranks[0] == ranks[1]
    assert DataPipeline(load_config(tiny(eval_batches=7, seed=6))).eval_subset() != subset  # control
    assert DataPipeline(load_config(tiny(eval_batches=total))).eval_subset() is None  # the whole split
    assert DataPipeline(load_config(tiny())).eval_subset() is None


def subset_loss(config: Any, params: dict[str, np.ndarray]) -> float:
    """The mean token cross-entropy of the final weights over the subset's windows, computed here."""
    pipe = DataPipeline(config)
    val, step = pipe.dataset.val, 8
    windows = (val.take(np.arange(j * step, min((j + 1) * step, len(val)))) for j in pipe.eval_subset())
    return mean_token_loss(config, params, ((w["x"], w["y"]) for w in windows))


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_evaluations_use_the_subset_and_say_so(tmp_path: Path, backend: str) -> None:
    config = load_config(tiny(eval_batches=5))
    result = train(backend, config, tmp_path / "run")
    lines = evals(read_metrics(tmp_path / "run" / "metrics.jsonl"))
    assert [r["val_batches"] for r in lines] == [5, 5]
    # float32 forward passes in another summation order: a few float32 eps (measured 4.5e-8)
    assert lines[-1]["val_loss"] == pytest.approx(subset_loss(config, result.params), rel=1e-6)
    full = train(backend, load_config(tiny()), tmp_path / "full")
    whole = evals(read_metrics(tmp_path / "full" / "metrics.jsonl"))
    assert "val_batches" not in whole[-1] and whole[-1]["val_loss"] != lines[-1]["val_loss"]  # control
    assert all(np.array_equal(full.params[k], result.params[k]) for k in full.params)  # training untouched


def test_a_resumed_run_evaluates_the_same_subset(tmp_path: Path) -> None:
    config = load_config(tiny(eval_batches=5), ["checkpoint.every=3", "checkpoint.at_end=true"])
    train("torch", config, tmp_path / "whole")
    short = load_config(tiny(eval_batches=5, max_updates=3), ["checkpoint.every=3"])
    train("torch", short, tmp_path / "part")
    train("torch", config, tmp_path / "part", resume=True)
    want = evals(read_metrics(tmp_path / "whole" / "metrics.jsonl"))
    got = evals(read_metrics(tmp_path / "part" / "metrics.jsonl"))
    assert got[-1] == want[-1]


# --- the recipe trains on both trainers ----------------------------------------------------------------


def test_the_cpu_recipe_trains_on_both_trainers_alike(tmp_path: Path) -> None:
    # a warm-up of 10 instead of 100 (the trainer refuses runs shorter than their warm-up), from
    # nanoGPT's lr/(warmup + 1): 40 updates then cover the warm-up and the decay in a third of the time
    overrides = ["run.max_updates=40", "run.eval_every=40", "run.eval_batches=4", "checkpoint.every=0",
                 "checkpoint.at_end=false", "schedule.warmup_steps=10", f"schedule.start_factor={1 / 11!r}"]
    runs = {}
    for backend in ("torch", "jax"):
        train(backend, load_config(CPU, overrides), tmp_path / backend)
        runs[backend] = read_metrics(tmp_path / backend / "metrics.jsonl")
    t, j = updates(runs["torch"]), updates(runs["jax"])
    assert all(len(set(r["lr"])) == 1 for r in t + j)  # both groups (decayed or not) at one lr
    want = [nanogpt_lr(i, 1e-3, 10, 2000, 1e-4) for i in range(40)]
    assert [r["lr"][0] for r in t] == pytest.approx(want, rel=1e-12)
    # JAX's schedule in float32: a few roundings of float32 (eps 1.2e-7), measured 5.6e-8
    assert [r["lr"][0] for r in j] == pytest.approx(want, rel=1e-6)
    # float32 on both, same initial weights and batches: the runs drift apart by rounding over the
    # updates, bounded by ~100 float32 eps (1e-5; measured 2.5e-7 over these 40 updates, 2.8e-7 over 110)
    np.testing.assert_allclose([r["loss"] for r in j], [r["loss"] for r in t], rtol=1e-5)
    assert t[-1]["loss"] < math.log(65) - 0.9  # from ln 65 = 4.17 at the start (2.77 measured)
    # the same drift, averaged over the evaluation's tokens: measured 4.4e-8
    assert evals(runs["jax"])[-1]["val_loss"] == pytest.approx(evals(runs["torch"])[-1]["val_loss"], rel=1e-5)
