"""The torch trainer on CUDA (skipped without a GPU; bench/gpu_check.sh runs these first).

fp16 with dynamic loss scaling and injected overflows takes exactly the CPU's skip and scale
decisions; bf16 autocast trains; a deterministic CUDA run resumes bit for bit with the CUDA RNG in
its checkpoint; gpt lines carry tokens/s and MFU against the device's bf16 peak.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.run.metrics import evals, read_metrics, updates
from ref_torch import trainer as tr

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BLOBS = {"model": {"name": "mlp", "hidden": [64]}, "data": {"name": "binary_blobs", "batch_size": 64},
         "optimizer": {"name": "adamw", "lr": 3e-3}, "clip": {"max_norm": 1.0}, "accumulation": {"steps": 2},
         "run": {"epochs": 2, "eval_every": 32}}


def cfg(*overrides: str):
    return load_config(BLOBS, list(overrides))


def run(config, out: Path, **kw):
    result = tr.train(config, out, progress="none", **kw)
    return result, read_metrics(out / "metrics.jsonl")


def test_fp16_overflows_take_the_cpu_decisions(tmp_path: Path) -> None:
    overrides = ("precision.dtype=\"float16\"", "precision.init_scale=1024.0", "precision.growth_interval=3",
                 "run.inject_nonfinite=[2, 3, 10]", "run.max_updates=16")
    _, gpu = run(cfg("run.device=\"cuda\"", *overrides), tmp_path / "gpu")
    _, cpu = run(cfg("run.device=\"cpu\"", *overrides), tmp_path / "cpu")
    for key in ("skipped", "loss_scale", "lr"):
        assert [r[key] for r in updates(gpu)] == [r[key] for r in updates(cpu)], key
    losses = [r["loss"] for r in updates(gpu) if not r["skipped"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_bf16_autocast_trains(tmp_path: Path) -> None:
    _, records = run(cfg("run.device=\"cuda\"", "precision.dtype=\"bfloat16\"", "precision.allow_tf32=true"),
                     tmp_path / "run")
    assert evals(records)[-1]["val_accuracy"] > 0.85
    assert all(r["loss_scale"] is None for r in updates(records))


def test_deterministic_cuda_run_resumes_bit_exact(tmp_path: Path) -> None:
    config = cfg("run.device=\"cuda\"", "run.deterministic=true", "checkpoint.every=8", "checkpoint.keep_last=100")
    full, _ = run(config, tmp_path / "full")
    state = ck.load_checkpoint(tmp_path / "full" / "checkpoints" / ck.step_name(8)).state
    assert "rank0/torch_cuda_0" in state.rng
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    for update, path in ck.list_checkpoints(tmp_path / "cut" / "checkpoints"):
        if update > 24:
            shutil.rmtree(path)
    resumed, _ = run(config, tmp_path / "cut", resume=True)
    assert all(np.array_equal(full.params[k], resumed.params[k]) for k in full.params)
    assert full.losses[24:] == resumed.losses


def test_gpt_lines_report_tokens_per_second_and_mfu(tmp_path: Path) -> None:
    config = load_config({"model": {"name": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 128},
                          "data": {"name": "text", "batch_size": 16}, "precision": {"dtype": "bfloat16"},
                          "run": {"max_updates": 20, "device": "cuda", "eval_every": 0}})
    _, records = run(config, tmp_path / "run")
    last = updates(records)[-1]
    assert last["tokens_per_s"] > 0 and last["peak_memory_bytes"] > 0
    name = torch.cuda.get_device_name()
    if any(k in name for k in ("H100", "H200", "A100")):
        assert 0.0 < last["mfu"] < 1.0
