"""torchrun with your own model: two processes training a user's nn.Module on a user's
arrays through `train(config, out, model=..., data=...)` equal one process with the same global
batch: DDP, FSDP2 with the default units (each top-level child module that holds parameters) and
with `[model] fsdp_units`, and a user's loss_fn under both normalizations (micro_batches
all-reduces each micro-batch's count after its forward pass; tokens divides once by the
all-reduced count after the window). float64: only the order of summation differs, so the bound is
1e-12 relative; lr, skips, loss scales, epochs, samples seen and accuracy are equal, and so are
the final parameters.

The run is tests/support/user_models.py's (kind "plain": Linear → tanh → Linear, no buffers; AdamW,
warm-up + cosine, clipping, accumulation of 2, dynamic loss scaling with injected overflows),
launched as a script under torchrun: the user's own program, not `twinstep train`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from support.processes import PROCESS_S, run_process

from conformance import checkpoint as ck
from conformance.rules.tolerance import Tolerance
from conformance.run.compare import compare_runs, describe_failure
from conformance.run.metrics import evals, read_metrics, updates

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "support" / "user_models.py"
EXACT = Tolerance(atol=0.0, rtol=1e-12)
COMMON = ("--kind", "plain", "--set", 'precision.dtype="float64"', "--set", "run.max_updates=12")


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("TWINSTEP_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "XLA_FLAGS"))}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return e


def run(out: Path, ways: int, *args: str) -> None:
    head = [sys.executable] if ways == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                 "--nproc_per_node", str(ways)]
    per_rank = ("--set", f"data.batch_size={24 // ways}")
    proc = run_process([*head, str(SCRIPT), "torch", str(out), *COMMON, *per_rank, *args], "finish training",
                       PROCESS_S, env=env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


VARIANTS = [
    pytest.param((), (), id="ddp"),
    pytest.param(("--set", 'run.parallel="fsdp"'), (), id="fsdp-default-units"),
    pytest.param(("--set", 'run.parallel="fsdp"', "--set", 'model.name="user"', "--set", 'model.fsdp_units=["2"]'),
                 (), id="fsdp-units"),
    pytest.param((), ("--loss-fn", "--set", 'accumulation.normalize="micro_batches"'), id="ddp-loss_fn-micro_batches"),
    pytest.param((), ("--loss-fn",), id="ddp-loss_fn-tokens"),
]


@pytest.mark.parametrize(("two_only", "both"), VARIANTS)
def test_two_processes_equal_one_with_the_same_global_batch(tmp_path: Path, two_only: tuple, both: tuple) -> None:
    run(tmp_path / "two", 2, *two_only, *both)
    run(tmp_path / "one", 1, *both)
    result = compare_runs(tmp_path / "one", tmp_path / "two", tolerance=EXACT)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    a, b = read_metrics(tmp_path / "one" / "metrics.jsonl"), read_metrics(tmp_path / "two" / "metrics.jsonl")
    assert len(updates(a)) == len(updates(b)) == 12 and [r["lr"] for r in updates(a)] == [r["lr"] for r in updates(b)]
    assert [r.get("val_accuracy") for r in evals(a)] == [r.get("val_accuracy") for r in evals(b)]
    assert any(r["skipped"] for r in updates(a))  # the injected overflow went through both
    one = ck.load_checkpoint(ck.find_latest(tmp_path / "one" / "checkpoints"))
    two = ck.load_checkpoint(ck.find_latest(tmp_path / "two" / "checkpoints"))
    assert (one.manifest["world_size"], two.manifest["world_size"]) == (1, 2)
    assert set(one.state.model) == set(two.state.model) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for name in one.state.model:
        np.testing.assert_allclose(two.state.model[name], one.state.model[name], rtol=1e-12, atol=1e-15, err_msg=name)


def test_fsdp_units_that_match_nothing_are_refused(tmp_path: Path) -> None:
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = run_process([*head, str(SCRIPT), "torch", str(tmp_path / "run"), *COMMON, "--set", 'run.parallel="fsdp"',
                        "--set", 'model.name="user"', "--set", 'model.fsdp_units=["blocks.*"]'], "refuse the units",
                       PROCESS_S, env=env(), capture_output=True, text=True)
    assert proc.returncode != 0 and "model.fsdp_units: 'blocks.*' matches no submodule" in proc.stderr
