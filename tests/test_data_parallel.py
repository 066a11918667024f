"""Data parallel training, one test body for both frameworks (`[torch]`, `[jax]`): a run split two
ways equals one process with the same global batch, and a run split two ways resumes bit for bit.

- torch: two CPU processes (`torchrun --nproc_per_node 2`, gloo), DDP or FSDP2 (`run.parallel`:
  parameters, gradients and optimizer state sharded; the gpt's tied embedding included; checkpoints
  hold whole tensors in the neutral format). Global batch = world size × data.batch_size ×
  accumulation.steps, so two processes with batch_size 12 train like one with 24.
- JAX: one process over two CPU devices (jax.sharding). XLA_FLAGS=--xla_force_host_platform_device_count=2
  must be set before JAX initialises, so every JAX run here is a subprocess. Global batch =
  data.batch_size × accumulation.steps whatever the device count; each micro-batch is split over
  the devices, padded with a mask to a multiple of their number.

The same config for both (MLP, AdamW, cosine schedule, clipping, accumulation of 3, float64, two
epochs, evaluations), but for the data geometry, sized for what each split must survive: torch's
last micro-batch of an epoch has 1 sample (rank 1's part is empty); JAX's micro-batch of 31 does not
split evenly (padded to 32 rows, 16 per device) and its evaluation batch of 25 neither. Windows end
incomplete. float64, so the only difference is the order of summation: the bound is 1e-12 relative
(measured ~2e-16); lr, skips, loss scale, epochs, samples seen and accuracy are equal.

The resume check is a tiny gpt with dropout (torch: each rank draws its own masks, and its
checkpoint holds both ranks' RNG, `rank0/` and `rank1/`; JAX: keys from run.seed and the update).

Torch only: a finished run leaves no process group threads behind (with a negative control).
JAX only: the placed batch really is split over the two devices.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from support.processes import PROCESS_S, run_process
from support.resume import differences

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.rules.tolerance import Tolerance
from conformance.run.compare import compare_runs, describe_failure
from conformance.run.metrics import evals, read_metrics, updates

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
[model]
name = "mlp"
hidden = [8]
[data]
name = "binary_blobs"
{data}
[optimizer]
name = "adamw"
lr = 1e-2
[schedule]
name = "cosine"
t_max = 12
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

GPT = """
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
"""


def clean_env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("TWINSTEP_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "XLA_FLAGS"))}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return e


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# the two ways of splitting a run
# ---------------------------------------------------------------------------------------------


def torchrun(config: Path, out: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "conformance", "train", str(config), "--backend", "torch", "--out", str(out), "--progress", "none",
           *args]
    _check(run_process(cmd, "finish training", PROCESS_S, env=clean_env(), capture_output=True, text=True))


def torch_single(config: Path, out: Path) -> None:
    import torch

    from ref_torch.trainer import train

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(config), out, rank=0, world_size=1, progress="none")
    finally:
        torch.set_num_threads(before)


def jax_run(devices: int, cache: Path) -> Callable[..., None]:
    def run(config: Path, out: Path, *args: str) -> None:
        extra = {"JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                 "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
        if devices > 1:
            extra["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        cmd = [sys.executable, "-m", "conformance", "train", str(config), "--backend", "jax", "--out", str(out),
               "--progress", "none", *args]
        _check(run_process(cmd, "finish training", PROCESS_S, env=clean_env(**extra), capture_output=True, text=True))

    return run


def torch_ways(out: Path) -> int:
    """The number of processes that trained the run: the manifest's world size, each with its RNG."""
    found = ck.load_checkpoint(ck.find_latest(out / "checkpoints"))
    world = int(found.manifest["world_size"])
    assert {k.split("/")[0] for k in found.state.rng} == {f"rank{r}" for r in range(world)}
    return world


def jax_ways(out: Path) -> int:
    """The number of devices that trained the run: the mesh in the manifest."""
    found = ck.load_checkpoint(ck.find_latest(out / "checkpoints"))
    return len(found.manifest["versions"]["jax_devices"].split(","))


class Split(NamedTuple):
    """One framework's two-way split: `parallel` and `single` train a config file into a directory
    (with CLI arguments), `data` is the config's data geometry (global micro-batch) and `per_way`
    what the two-way run sets for it, `ways` how many processes or devices a run used."""

    framework: str
    parallel: Callable[..., None]
    single: Callable[..., None]
    data: str
    per_way: tuple[str, ...]
    ways: Callable[[Path], int]


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compilation cache the JAX subprocesses of this module share (a resume loads its step)."""
    return tmp_path_factory.mktemp("dp-xla-cache")


def split_of(framework: str, cache: Path) -> Split:
    if framework == "torch":
        # 145 train samples: 6 global micro-batches of 24, then 1 sample (rank 1's part is empty)
        return Split("torch", torchrun, torch_single, "n_samples = 181\nbatch_size = 24",
                     ("--set", "data.batch_size=12"), torch_ways)
    # 240 train samples: 7 micro-batches of 31 (32 rows on 2 devices), then 23; evaluation batches of 25
    return Split("jax", jax_run(2, cache), jax_run(1, cache), "n_samples = 300\nbatch_size = 31\neval_batch_size = 25",
                 (), jax_ways)


# ---------------------------------------------------------------------------------------------
# two ways equal one with the same global batch
# ---------------------------------------------------------------------------------------------

EXACT = Tolerance(atol=0.0, rtol=1e-12)  # float64: only the order of summation differs

VARIANTS = [pytest.param("torch", "ddp", "micro_batches", id="ddp-micro_batches[torch]"),
            pytest.param("torch", "ddp", "tokens", id="ddp-tokens[torch]"),
            pytest.param("torch", "fsdp", "micro_batches", id="fsdp-micro_batches[torch]"),
            pytest.param("jax", "sharding", "micro_batches", id="sharding-micro_batches[jax]"),
            pytest.param("jax", "sharding", "tokens", id="sharding-tokens[jax]")]


def mode_args(split: Split, parallel: str) -> tuple[str, ...]:
    """torch: run.parallel = "ddp" | "fsdp"; JAX has one way (jax.sharding)."""
    return ("--set", f'run.parallel="{parallel}"') if split.framework == "torch" else ()


def assert_same_training(one: Path, two: Path) -> None:
    """Run `two` trained as run `one`: every metrics line (loss, grad_norm, val_loss to EXACT; lr,
    skips, loss scale, epoch, samples seen and accuracy equal) and the final parameters."""
    result = compare_runs(one, two, tolerance=EXACT)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert len(updates(a)) == len(updates(b)) == 6 and len(evals(a)) == len(evals(b)) == 2
    assert [r["lr"] for r in updates(a)] == [r["lr"] for r in updates(b)]
    assert [r["val_accuracy"] for r in evals(a)] == [r["val_accuracy"] for r in evals(b)]
    pa = ck.load_checkpoint(ck.find_latest(one / "checkpoints")).state.model
    pb = ck.load_checkpoint(ck.find_latest(two / "checkpoints")).state.model
    assert set(pa) == set(pb)
    for name in pa:
        np.testing.assert_allclose(pb[name], pa[name], rtol=1e-12, atol=1e-15, err_msg=name)


@pytest.mark.parametrize(("framework", "parallel", "normalize"), VARIANTS)
def test_two_ways_equal_one_with_the_same_global_batch(tmp_path: Path, xla_cache: Path, framework: str,
                                                       parallel: str, normalize: str) -> None:
    split = split_of(framework, xla_cache)
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(data=split.data, normalize=normalize))
    split.parallel(config, tmp_path / "two", *split.per_way, *mode_args(split, parallel))
    split.single(config, tmp_path / "one")
    assert (split.ways(tmp_path / "one"), split.ways(tmp_path / "two")) == (1, 2)
    assert_same_training(tmp_path / "one", tmp_path / "two")


# ---------------------------------------------------------------------------------------------
# a two-way run resumes bit for bit
# ---------------------------------------------------------------------------------------------

RESUMES = [pytest.param("torch", "ddp", id="ddp[torch]"), pytest.param("torch", "fsdp", id="fsdp[torch]"),
           pytest.param("jax", "sharding", id="sharding[jax]")]


class Resumed(NamedTuple):
    full: Path  # the uninterrupted two-way run
    cut: Path  # the same, cut back to its checkpoint after 4 updates and resumed two ways


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory: pytest.TempPathFactory, xla_cache: Path) -> Callable[[str, str], Resumed]:
    """Each variant's full and resumed runs, made once for the module when first asked for."""
    made: dict[tuple[str, str], Resumed] = {}

    def get(framework: str, parallel: str) -> Resumed:
        if (framework, parallel) not in made:
            split = split_of(framework, xla_cache)
            tmp = tmp_path_factory.mktemp(f"resume-{parallel}-{framework}")
            corpus = tmp / "corpus.txt"
            corpus.write_text(" ".join(np.random.default_rng(1).choice(["ab", "cd", "ef", "gh", "ij"], 300)))
            config = tmp / "gpt.toml"
            config.write_text(GPT.format(corpus=corpus))
            args = mode_args(split, parallel)  # the same config both ways: torch's ranks each take 4 sequences
            full = tmp / "full"
            split.parallel(config, full, *args)
            cut = tmp / "cut"
            shutil.copytree(full, cut)
            for update, path in ck.list_checkpoints(cut / "checkpoints"):
                if update > 4:
                    shutil.rmtree(path)
            split.parallel(config, cut, "--resume", *args)
            assert split.ways(full) == split.ways(cut) == 2
            made[(framework, parallel)] = Resumed(full, cut)
        return made[(framework, parallel)]

    return get


@pytest.mark.parametrize(("framework", "parallel"), RESUMES)
def test_two_way_run_resumes_bit_exact(resumed_runs, framework: str, parallel: str) -> None:
    runs = resumed_runs(framework, parallel)
    assert differences(runs.full, runs.cut, 12) == []  # model, optimizer state, counters, metrics: bit for bit


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torch_each_rank_keeps_its_own_rng_stream(resumed_runs, parallel: str) -> None:
    rng = ck.load_checkpoint(resumed_runs("torch", parallel).cut / "checkpoints" / ck.step_name(12)).state.rng
    assert not np.array_equal(rng["rank0/torch_cpu"], rng["rank1/torch_cpu"])


# ---------------------------------------------------------------------------------------------
# torch only: no process group outlives a run
# ---------------------------------------------------------------------------------------------

LEAK_PROBE = """
import os, sys, time
from ref_torch import _parallel
if os.environ.get("PROBE_DISABLE_RELEASE"):  # the negative control: the group's holders are left in place
    _parallel._import_parallel_modules = lambda: None
    _parallel._release_dtensor_caches = lambda: None
    _parallel.gc = type("nogc", (), {"collect": staticmethod(lambda: 0)})
from ref_torch.trainer import train
from conformance.config import load_config
train(load_config(sys.argv[1], sys.argv[3:]), sys.argv[2], progress="none")
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
mine = f"{sys.argv[2]}-threads-{os.environ['RANK']}.txt"  # ranks share stdout: one file each
with open(mine + ".part", "w") as f:
    f.write(",".join(sorted(names)))
os.replace(mine + ".part", mine)
# a kept-alive group can abort this process at exit, and torchrun then kills the other rank: wait
# until both ranks have written, so that the abort cannot cost the other rank its file
other = f"{sys.argv[2]}-threads-{1 - int(os.environ['RANK'])}.txt"
deadline = time.monotonic() + 300
while not os.path.exists(other) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def leftover_threads(tmp_path: Path, parallel: str, disable: bool) -> list[str]:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(data="n_samples = 181\nbatch_size = 12", normalize="micro_batches")
                      .replace("epochs = 2", "max_updates = 2"))
    script = tmp_path / "probe.py"
    script.write_text(LEAK_PROBE)
    e = clean_env(**({"PROBE_DISABLE_RELEASE": "1"} if disable else {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(config), str(tmp_path / "out"), f'run.parallel="{parallel}"']
    proc = run_process(cmd, "finish the probe", PROCESS_S, env=e, capture_output=True, text=True)
    if not disable:  # a finished run exits cleanly; a kept-alive group may abort at exit (SIGABRT)
        _check(proc)
    files = [tmp_path / f"out-threads-{rank}.txt" for rank in (0, 1)]
    missing = [f.name for f in files if not f.is_file()]
    assert not missing, f"rank files {missing} not written (exit {proc.returncode}): {proc.stderr[-3000:]}"
    return [name for f in files for name in f.read_text().split(",") if "gloo" in name]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists threads through /proc (Linux)")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torch_finished_run_leaves_no_process_group_threads(tmp_path: Path, parallel: str) -> None:
    # a group that outlives train() is torn down during interpreter exit, where its gloo threads can
    # abort a finished run (SIGABRT, "terminate called without an active exception")
    assert leftover_threads(tmp_path, parallel, disable=False) == []


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists threads through /proc (Linux)")
def test_torch_negative_control_the_thread_check_sees_a_group_kept_alive(tmp_path: Path) -> None:
    # the group kept alive on purpose may abort the run at interpreter exit: whatever the exit code,
    # the check must see its threads in what each rank wrote before exiting
    assert "pt_gloo_runloop" in leftover_threads(tmp_path, "fsdp", disable=True)


# ---------------------------------------------------------------------------------------------
# JAX only: the batch is split over the devices
# ---------------------------------------------------------------------------------------------

SHARDING_PROBE = """
import numpy as np, jax
from conformance.config import load_config
from conformance.data import DataPipeline
from conformance.run.batches import window_counts
from ref_jax._parallel import placement
from ref_jax._window import WindowLayout, rows_for
cfg = load_config({"data": {"name": "binary_blobs", "n_samples": 300, "batch_size": 31}, "accumulation": {"steps": 3}})
data = DataPipeline(cfg)
place = placement("cpu")
layout = WindowLayout(3, rows_for(31, place.count), np.float32)
w = data.window(0)
arrays = place.put_batch(layout.pad(w, window_counts(cfg, w)), axis=1)
x = arrays["data"]["x"]
shards = x.addressable_shards
print(place.count, x.shape, sorted({s.data.shape for s in shards}), len({s.device for s in shards}),
      arrays["present"].sharding.is_fully_replicated)
"""


def test_jax_batch_is_split_over_the_devices() -> None:
    e = clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = run_process([sys.executable, "-c", SHARDING_PROBE], "print the sharding", PROCESS_S, env=e,
                       capture_output=True, text=True, cwd=ROOT)
    _check(proc)
    assert proc.stdout.split("\n")[0] == "2 (3, 32, 20) [(3, 16, 20)] 2 True"
