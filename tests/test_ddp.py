"""Data parallel training: two CPU processes (torchrun, gloo) equal one process with the same global batch.

Global batch = world size × data.batch_size × accumulation.steps, so `torchrun --nproc_per_node 2`
with batch_size 12 must train like one process with batch_size 24: the same windows, the same
normalization (micro-batch means over the *global* micro-batch; tokens: the all-reduced count),
the same skip decisions. float64, so the only difference is the order of summation: the bound is
1e-12 relative (measured: 2e-16). The data is sized so that the last micro-batch of an epoch has
1 sample (rank 1's part is empty) and the last accumulation window is incomplete.

A DDP run also resumes bit for bit from a checkpoint holding both ranks' RNG (`rank0/`, `rank1/`):
a tiny gpt with dropout, where each rank draws its own masks. The same for FSDP2
(`run.parallel = "fsdp"`: parameters, gradients and optimizer state sharded; the gpt's tied
embedding included), whose checkpoints hold whole tensors in the neutral format.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.resume import differences

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.run.metrics import evals, read_metrics, updates

ROOT = Path(__file__).resolve().parents[1]

MLP = """
[model]
name = "mlp"
hidden = [8]
[data]
name = "binary_blobs"
n_samples = 181            # 145 train: 6 global micro-batches of 24, then 1 sample
batch_size = 12
[optimizer]
name = "adamw"
lr = 1e-2
[clip]
max_norm = 0.5
[accumulation]
steps = 3
normalize = "{normalize}"
[precision]
dtype = "float64"
[checkpoint]
at_end = true
[run]
epochs = 2
eval_every = 3
device = "cpu"
"""


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                   "MASTER_"))}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return e


def torchrun(config: Path, out: Path, *extra: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "conformance", "train", str(config), "--backend", "torch", "--out", str(out), "--progress", "none",
           *extra]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def single(config: Path, out: Path, *overrides: str) -> None:
    import torch

    from ref_torch.trainer import train

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(config, list(overrides)), out, rank=0, world_size=1, progress="none")
    finally:
        torch.set_num_threads(before)


def final_model(out: Path) -> dict[str, np.ndarray]:
    return ck.load_checkpoint(ck.find_latest(out / "checkpoints")).state.model


@pytest.mark.parametrize(("parallel", "normalize"), [("ddp", "micro_batches"), ("ddp", "tokens"),
                                                     ("fsdp", "micro_batches")])
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path: Path, parallel: str, normalize: str) -> None:
    config = tmp_path / "run.toml"
    config.write_text(MLP.format(normalize=normalize))
    torchrun(config, tmp_path / "ddp", "--set", f'run.parallel="{parallel}"')
    single(config, tmp_path / "one", "data.batch_size=24")
    a, b = read_metrics(tmp_path / "one" / "metrics.jsonl"), read_metrics(tmp_path / "ddp" / "metrics.jsonl")
    ua, ub = updates(a), updates(b)
    assert len(ua) == len(ub) == 6
    for x, y in zip(ua, ub):
        for key in ("epoch", "samples_seen", "lr", "skipped", "loss_scale"):
            assert x[key] == y[key], (x["update"], key)
        np.testing.assert_allclose(y["loss"], x["loss"], rtol=1e-12, atol=0)
        np.testing.assert_allclose(y["grad_norm"], x["grad_norm"], rtol=1e-12, atol=0)
    for x, y in zip(evals(a), evals(b)):
        np.testing.assert_allclose(y["val_loss"], x["val_loss"], rtol=1e-12)
        assert x["val_accuracy"] == y["val_accuracy"]
    pa, pb = final_model(tmp_path / "one"), final_model(tmp_path / "ddp")
    for name in pa:
        np.testing.assert_allclose(pb[name], pa[name], rtol=1e-12, atol=1e-15, err_msg=name)
    meta = ck.load_checkpoint(ck.find_latest(tmp_path / "ddp" / "checkpoints"))
    assert meta.manifest["world_size"] == 2
    assert {k.split("/")[0] for k in meta.state.rng} == {"rank0", "rank1"}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_ddp_run_resumes_bit_exact_with_every_ranks_rng(tmp_path: Path, parallel: str) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(np.random.default_rng(1).choice(["ab", "cd", "ef", "gh", "ij"], 300)))
    config = tmp_path / "gpt.toml"
    config.write_text(f"""
[model]
name = "gpt"
n_layer = 1
n_head = 2
n_embd = 16
block_size = 8
dropout = 0.2
[data]
name = "text"
path = "{corpus}"
batch_size = 4
[optimizer]
name = "adamw"
lr = 3e-3
[accumulation]
steps = 2
normalize = "tokens"
[checkpoint]
every = 4
keep_last = 100
[run]
max_updates = 12
eval_every = 6
device = "cpu"
""")
    full = tmp_path / "full"
    torchrun(config, full, "--set", f'run.parallel="{parallel}"')
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    for update, path in ck.list_checkpoints(cut / "checkpoints"):
        if update > 4:
            shutil.rmtree(path)
    torchrun(config, cut, "--resume", "--set", f'run.parallel="{parallel}"')
    assert differences(full, cut, 12) == []  # model, optimizer state, counters, metrics: bit for bit
    rng = ck.load_checkpoint(cut / "checkpoints" / ck.step_name(12)).state.rng
    assert not np.array_equal(rng["rank0/torch_cpu"], rng["rank1/torch_cpu"])  # each rank its own stream


LEAK_PROBE = """
import os, sys
from ref_torch import _parallel
if os.environ.get("PROBE_DISABLE_RELEASE"):  # the negative control: the group's holders are left in place
    _parallel._import_parallel_modules = lambda: None
    _parallel._release_dtensor_caches = lambda: None
    _parallel.gc = type("nogc", (), {"collect": staticmethod(lambda: 0)})
from ref_torch.trainer import train
from conformance.config import load_config
train(load_config(sys.argv[1], sys.argv[3:]), sys.argv[2], progress="none")
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
with open(f"{sys.argv[2]}-threads-{os.environ['RANK']}.txt", "w") as f:  # ranks share stdout
    f.write(",".join(sorted(names)))
"""


def leftover_threads(tmp_path: Path, parallel: str, disable: bool) -> list[str]:
    config = tmp_path / "run.toml"
    config.write_text(MLP.format(normalize="micro_batches").replace("epochs = 2", "max_updates = 2"))
    script = tmp_path / "probe.py"
    script.write_text(LEAK_PROBE)
    e = env()
    if disable:
        e["PROBE_DISABLE_RELEASE"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(config), str(tmp_path / "out"), f'run.parallel="{parallel}"']
    proc = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [(tmp_path / f"out-threads-{rank}.txt").read_text() for rank in (0, 1)]
    return [name for ln in lines for name in ln.split(",") if "gloo" in name]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists threads through /proc (Linux)")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_finished_run_leaves_no_process_group_threads(tmp_path: Path, parallel: str) -> None:
    # a group that outlives train() is torn down during interpreter exit, where its gloo threads can
    # abort a finished run (SIGABRT, "terminate called without an active exception")
    assert leftover_threads(tmp_path, parallel, disable=False) == []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists threads through /proc (Linux)")
def test_negative_control_the_thread_check_sees_a_group_kept_alive(tmp_path: Path) -> None:
    assert "pt_gloo_runloop" in leftover_threads(tmp_path, "fsdp", disable=True)
