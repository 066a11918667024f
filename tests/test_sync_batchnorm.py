"""`[run] sync_batchnorm`: a user's BatchNorm model trains on two processes as on one.

The model is tests/support/user_models.py's "bn-plain" (Linear → BatchNorm1d → ReLU → Linear; no
dropout, so the statistics are the only thing that can differ across processes), float64, 12
updates of 2 micro-batches, the global micro-batch 24 rows (12 per rank on two). With
sync_batchnorm the torch trainer normalizes each micro-batch by the statistics of all 24 rows, as
one process does (only the order of summation differs: float64 rounding compounded over 12
AdamW updates, bounded by 1e-12 relative as tests/test_user_parallel.py bounds it; measured 2e-16
on the losses and grad norms, 1e-16 on val_loss, 2.6e-14 on the final weights and running
statistics, whose smallest entry is 2.8e-4, so atol = 1e-15 never decides); without it each
rank normalizes its 12 rows by their own statistics (the negative control: the runs differ at
1e-3). The JAX trainer's micro-batch is one global array split over
the devices, so its statistics are the whole micro-batch's whatever the setting: two devices equal
one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from support.processes import PROCESS_S, child_env, run_process

from conformance import checkpoint as ck
from conformance.rules.tolerance import Tolerance
from conformance.run.compare import compare_runs, describe_failure
from conformance.run.metrics import evals, read_metrics

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "support" / "user_models.py"
EXACT = Tolerance(atol=0.0, rtol=1e-12)
COMMON = ("--kind", "bn-plain", "--set", 'precision.dtype="float64"', "--set", "run.max_updates=12")
BUFFERS = {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}


def train(framework: str, out: Path, ways: int, *args: str, env: dict[str, str] | None = None) -> None:
    head = [sys.executable] if ways == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                 "--nproc_per_node", str(ways)]
    proc = run_process([*head, str(SCRIPT), framework, str(out), *COMMON, "--set", f"data.batch_size={24 // ways}",
                        *args], "finish training", PROCESS_S, env=env or child_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def torch_one(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process torch run both torch tests compare with."""
    out = tmp_path_factory.mktemp("sync_bn") / "one"
    train("torch", out, 1)
    return out


def final(out: Path) -> ck.TrainingState:
    return ck.load_checkpoint(ck.find_latest(out / "checkpoints"))


def test_torch_two_processes_with_sync_batchnorm_equal_one(torch_one: Path, tmp_path: Path) -> None:
    train("torch", tmp_path / "two", 2, "--set", "run.sync_batchnorm=true")
    result = compare_runs(torch_one, tmp_path / "two", tolerance=EXACT)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    one, two = final(torch_one), final(tmp_path / "two")
    assert (one.manifest["world_size"], two.manifest["world_size"]) == (1, 2)
    # the running statistics (checkpointed under BatchNorm's names) come from the synchronized ones;
    # evaluations, which use them, were compared above
    assert BUFFERS <= set(one.state.model) and set(one.state.model) == set(two.state.model)
    for name in one.state.model:
        np.testing.assert_allclose(two.state.model[name], one.state.model[name], rtol=1e-12, atol=1e-15, err_msg=name)
    assert len(evals(read_metrics(tmp_path / "two" / "metrics.jsonl"))) == 3


def test_negative_control_torch_two_processes_without_it_differ(torch_one: Path, tmp_path: Path) -> None:
    train("torch", tmp_path / "two", 2)
    result = compare_runs(torch_one, tmp_path / "two", tolerance=EXACT)
    assert not result.passed and result.first_failure is not None
    one, two = final(torch_one).state.model, final(tmp_path / "two").state.model
    assert not np.allclose(two["bn.running_var"], one["bn.running_var"], rtol=1e-6, atol=0)


def test_jax_statistics_are_the_whole_micro_batchs_over_devices(tmp_path: Path) -> None:
    train("jax", tmp_path / "one", 1)
    env = {**child_env(), "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    train("jax", tmp_path / "two", 1, "--set", "run.sync_batchnorm=true", env=env)
    result = compare_runs(tmp_path / "one", tmp_path / "two", tolerance=EXACT)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    one, two = final(tmp_path / "one"), final(tmp_path / "two")
    assert two.manifest["versions"]["jax_devices"] == "cpu:0,cpu:1"  # the micro-batch split over two
    assert {"bn.mean", "bn.var"} <= set(one.state.model)
    for name in one.state.model:
        np.testing.assert_allclose(two.state.model[name], one.state.model[name], rtol=1e-12, atol=1e-15, err_msg=name)
