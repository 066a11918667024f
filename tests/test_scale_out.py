"""Scaling out with real processes on the CPU: torchrun + gloo for torch, torchrun +
jax.distributed (gloo CPU collectives) for JAX. The same float64 MLP config everywhere (AdamW,
cosine, clipping, accumulation of 3, two epochs, evaluations), whose global batch is world size ×
data.batch_size × accumulation.steps = 72 in every run: 2 ranks × 12, 1 × 24, 4 × 6.

In CI (one run of each feature): an FSDP2 run's checkpoints are per-rank shards, and the run cut
back to update 2 and resumed on ONE process ends where the uninterrupted two-rank run ends; two JAX
processes train as one process with the same global batch, and write the sharded layout; FSDP2
with clip.per_parameter and run.compile trains as one process does, and so does FSDP2 clipping the
step (clip.target = "updates"). Negative controls: a resume that changes the global batch is refused
naming the three fields; the comparison catches a run with half the global batch, global-norm
clipping in place of per-parameter clipping, and the gradients clipped in place of the step.

With -m slow: the same checkpoint resumes on 4 ranks; JAX processes and torch FSDP resume each
other's sharded checkpoints; per-parameter clipping with each rank's local shard norms (the mutant
the all-reduce prevents) is caught.

Which reductions change order between world sizes (float64: within 1e-10 relative, measured
≤ 4e-16): the gradient sums over a global micro-batch (each rank sums its rows, then the ranks'
sums are added: all-reduce in torch, XLA's cross-device reduction in JAX), the window's count of
valid elements (summed per rank, then over the ranks), the evaluation sums, and under FSDP the
squared norm of the gradient (each rank's shard norm, then the sum over ranks). Nothing else
depends on the world size.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.processes import PROCESS_S, run_process

from conformance import checkpoint as ck
from conformance.rules.tolerance import Tolerance
from conformance.run.compare import compare_runs, describe_failure

ROOT = Path(__file__).resolve().parents[1]
SAME = Tolerance(atol=0.0, rtol=1e-10)  # the float64 bound

CONFIG = """
[model]
name = "mlp"
hidden = [8]
[data]
name = "binary_blobs"
n_samples = 181
batch_size = 12
[optimizer]
name = "adamw"
lr = 1e-2
[schedule]
name = "cosine"
t_max = 12
[clip]
max_norm = {max_norm}
per_parameter = {per_parameter}
[accumulation]
steps = 3
[precision]
dtype = "float64"
[checkpoint]
every = 2
keep_last = 100
[run]
epochs = 2
eval_every = 3
device = "cpu"
parallel = "fsdp"
"""


def clean_env(cache: Path | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("TWINSTEP_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "XLA_FLAGS"))}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if cache is not None:
        e.update(JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return e


def train(config: Path, out: Path, backend: str, nproc: int, *args: str, cache: Path | None = None,
          check: bool = True) -> subprocess.CompletedProcess:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
                if nproc > 1 else [sys.executable])
    cmd = [*launcher, "-m", "conformance", "train", str(config), "--backend", backend, "--out", str(out),
           "--progress", "none", *args]
    proc = run_process(cmd, "finish training", PROCESS_S, env=clean_env(cache), capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def assert_same_run(a: Path, b: Path) -> None:
    """Every metrics line within SAME (skips, loss scales, lrs' equality as compare checks them) and
    the final parameters too."""
    result = compare_runs(a, b, tolerance=SAME)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    pa = ck.load_checkpoint(ck.find_latest(a / "checkpoints")).state.model
    pb = ck.load_checkpoint(ck.find_latest(b / "checkpoints")).state.model
    assert set(pa) == set(pb)
    for name in pa:
        np.testing.assert_allclose(pb[name], pa[name], rtol=1e-10, atol=0, err_msg=name)


def assert_different_run(a: Path, b: Path) -> None:
    assert not compare_runs(a, b, tolerance=SAME).passed


def cut(run: Path, to: Path, keep: int = 2) -> Path:
    """A copy of `run` with only its checkpoints up to update `keep` (as if it had stopped there)."""
    shutil.copytree(run, to)
    for update, path in ck.list_checkpoints(to / "checkpoints"):
        if update > keep:
            shutil.rmtree(path)
    return to


def write_config(directory: Path, max_norm: float = 0.5, per_parameter: bool = False) -> Path:
    path = directory / f"run-{max_norm}-{per_parameter}.toml"
    path.write_text(CONFIG.format(max_norm=max_norm, per_parameter=str(per_parameter).lower()))
    return path


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scale-out")


@pytest.fixture(scope="module")
def xla_cache(tmp: Path) -> Path:
    return tmp / "xla-cache"


@pytest.fixture(scope="module")
def fsdp_two(tmp: Path) -> Path:
    """The uninterrupted two-rank FSDP2 run."""
    train(write_config(tmp), tmp / "fsdp-two", "torch", 2)
    return tmp / "fsdp-two"


@pytest.fixture(scope="module")
def jax_two(tmp: Path, xla_cache: Path) -> Path:
    """The uninterrupted two-process JAX run."""
    train(write_config(tmp), tmp / "jax-two", "jax", 2, cache=xla_cache)
    return tmp / "jax-two"


# ---------------------------------------------------------------------------------------------
# CI: sharded checkpoints resume on one process; JAX processes; FSDP completeness
# ---------------------------------------------------------------------------------------------


def test_fsdp_checkpoint_is_sharded_and_resumes_on_one_process(fsdp_two: Path, tmp: Path) -> None:
    for update, path in ck.list_checkpoints(fsdp_two / "checkpoints"):
        manifest = ck.verify_checkpoint(path)
        assert manifest["format_version"] == 3 and manifest["world_size"] == 2
        assert {"rank-00000.safetensors", "rank-00001.safetensors"} <= set(manifest["files"])
        assert "model.safetensors" not in manifest["files"]
    one = cut(fsdp_two, tmp / "fsdp-two-then-one")
    train(write_config(tmp), one, "torch", 1, "--resume", "--set", "data.batch_size=24")
    assert_same_run(fsdp_two, one)
    assert ck.verify_checkpoint(ck.find_latest(one / "checkpoints"))["format_version"] == 2  # one process: whole


def test_negative_control_a_resume_that_changes_the_global_batch_is_refused(fsdp_two: Path, tmp: Path) -> None:
    one = cut(fsdp_two, tmp / "fsdp-two-then-one-wrong")
    proc = train(write_config(tmp), one, "torch", 1, "--resume", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"twinstep: error: {one / 'checkpoints' / 'step-00000002'}: cannot resume: the global batch (world size × "
        f"data.batch_size × accumulation.steps) was 2 × 12 × 3 = 72 in the checkpoint and is 1 × 12 × 3 = 36 now; "
        f"keep the product equal (e.g. --set data.batch_size=24 on 1 ranks)"]


def test_jax_processes_train_as_one_process_with_the_same_global_batch(jax_two: Path, tmp: Path,
                                                                        xla_cache: Path) -> None:
    config = write_config(tmp)
    train(config, tmp / "jax-one", "jax", 1, "--set", "data.batch_size=24", cache=xla_cache)
    assert_same_run(tmp / "jax-one", jax_two)
    manifest = ck.verify_checkpoint(ck.find_latest(jax_two / "checkpoints"))
    assert manifest["format_version"] == 3 and manifest["world_size"] == 2
    assert {"rank-00000.safetensors", "rank-00001.safetensors"} <= set(manifest["files"])
    # negative control: one process with a rank's batch (half the global batch) is another run
    train(config, tmp / "jax-one-half", "jax", 1, cache=xla_cache)
    assert_different_run(tmp / "jax-one-half", jax_two)


def test_fsdp_clips_per_parameter_and_compiles_like_one_process(tmp: Path) -> None:
    config = write_config(tmp, max_norm=0.05, per_parameter=True)
    train(config, tmp / "pp-two", "torch", 2, "--set", "run.compile=true")
    train(config, tmp / "pp-one", "torch", 1, "--set", "data.batch_size=24")
    assert_same_run(tmp / "pp-one", tmp / "pp-two")
    # negative control: global-norm clipping at the same max_norm is another run (the clip is active)
    train(write_config(tmp, max_norm=0.05), tmp / "global-one", "torch", 1, "--set", "data.batch_size=24")
    assert_different_run(tmp / "global-one", tmp / "pp-two")


def test_fsdp_clips_the_step_like_one_process(tmp: Path) -> None:
    # clip.target = "updates": the step's norm over every rank's shards (an AdamW step of ~1e-2 per
    # element over 42 weights: ~0.065, clipped to 0.01 in every update)
    config, step = write_config(tmp, max_norm=0.01), ("--set", 'clip.target="updates"')
    train(config, tmp / "step-two", "torch", 2, *step)
    train(config, tmp / "step-one", "torch", 1, *step, "--set", "data.batch_size=24")
    assert_same_run(tmp / "step-one", tmp / "step-two")
    # negative control: clipping the gradients at the same max_norm is another run
    train(config, tmp / "grads-one", "torch", 1, "--set", "data.batch_size=24")
    assert_different_run(tmp / "grads-one", tmp / "step-two")


# ---------------------------------------------------------------------------------------------
# slow: four ranks, torch <-> JAX processes, the local-norm mutant
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_two_rank_checkpoint_resumes_on_four_ranks(fsdp_two: Path, tmp: Path) -> None:
    four = cut(fsdp_two, tmp / "fsdp-two-then-four")
    train(write_config(tmp), four, "torch", 4, "--resume", "--set", "data.batch_size=6")
    assert_same_run(fsdp_two, four)
    manifest = ck.verify_checkpoint(ck.find_latest(four / "checkpoints"))
    assert manifest["world_size"] == 4 and "rank-00003.safetensors" in manifest["files"]


@pytest.mark.slow
def test_jax_processes_and_torch_fsdp_resume_each_other(fsdp_two: Path, jax_two: Path, tmp: Path,
                                                        xla_cache: Path) -> None:
    config = write_config(tmp)
    jax_from_torch = cut(fsdp_two, tmp / "torch-then-jax")
    train(config, jax_from_torch, "jax", 2, "--resume", cache=xla_cache)
    assert_same_run(fsdp_two, jax_from_torch)
    torch_from_jax = cut(jax_two, tmp / "jax-then-torch")
    train(config, torch_from_jax, "torch", 2, "--resume")
    assert_same_run(jax_two, torch_from_jax)


@pytest.mark.slow
@pytest.mark.parametrize(("rank", "stage"), [(1, "after_first_file"), (0, "before_manifest")])
def test_a_rank_killed_inside_a_save_leaves_no_checkpoint_that_resume_takes(fsdp_two: Path, tmp: Path, rank: int,
                                                                            stage: str) -> None:
    """Rank `rank` is SIGKILLed inside the first save (update 2): rank 1 with its shard durable but
    unreported, or rank 0 with every shard reported but no manifest. No checkpoint is listed, the
    temporary directory goes at the next start, and --resume trains from the start like the
    uninterrupted run."""
    out = tmp / f"killed-{rank}-{stage}"
    faults = ROOT / "tests" / "support" / "faults.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(faults),
           "--rank", str(rank), "checkpoint", f"stage={stage}", "--", "train", str(write_config(tmp)), "--backend",
           "torch", "--out", str(out), "--progress", "none"]
    proc = run_process(cmd, f"crash at {stage}", PROCESS_S, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode != 0
    assert ck.list_checkpoints(out / "checkpoints") == []
    left = [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp-step-00000002-")]
    assert len(left) == 1 and not (left[0] / "manifest.json").exists()
    assert (left[0] / "rank-00001.safetensors").exists()  # a durable shard, never committed
    train(write_config(tmp), out, "torch", 2, "--resume")
    assert not left[0].exists()
    assert_same_run(fsdp_two, out)


LOCAL_NORMS = """
import sys
from ref_torch import _fsdp
from conformance.cli import main

whole = _fsdp.global_norm
# the mutant: per-parameter norms of each rank's shard only (the global norm stays right)
_fsdp.global_norm = lambda norm, p: norm if norm.ndim == 1 else whole(norm, p)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_negative_control_per_parameter_clipping_with_local_shard_norms_is_caught(tmp: Path) -> None:
    config = write_config(tmp, max_norm=0.05, per_parameter=True)
    script = tmp / "local_norms.py"
    script.write_text(LOCAL_NORMS)
    out = tmp / "pp-two-local"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           "train", str(config), "--backend", "torch", "--out", str(out), "--progress", "none"]
    proc = run_process(cmd, "finish training", PROCESS_S, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if not (tmp / "pp-one").exists():
        train(config, tmp / "pp-one", "torch", 1, "--set", "data.batch_size=24")
    assert_different_run(tmp / "pp-one", out)
