"""The newer optimizers' state under a hard kill, on both trainers (`[torch]`, `[jax]`): AdEMAMix
keeps a per-parameter update count that its α and β3 warm-ups read, and a slow EMA besides Adam's
two. A real `twinstep train` process killed (SIGKILL, exit 137) inside update 8, while both warm-ups
are still ramping, resumes from its checkpoint after update 6 and equals the uninterrupted run bit
for bit (tests/support/resume.py: weights, optimizer state, counters, every metrics line).
Controls: resumes that forget the optimizer state, or keep the moments but lose the counts (the
warm-ups read at t = 1 again), fail the same comparison.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.faults import fault_args
from support.processes import PROCESS_S, child_env, run_process
from support.resume import cut_after, differences, forgotten

from conformance import checkpoint as ck
from conformance import tomlio
from conformance.config import load_config
from conformance.run import session

pytestmark = pytest.mark.usefixtures("persistent_xla_cache", "one_thread")
FRAMEWORKS = ("torch", "jax")
UPDATES, CUT = 12, 6
ADEMAMIX: dict[str, Any] = {
    "model": {"name": "mlp", "hidden": [8]},
    "data": {"name": "linear_regression", "batch_size": 16},
    "loss": {"name": "mse"},
    "optimizer": {"name": "ademamix", "lr": 0.02, "beta3": 0.999, "alpha": 4.0, "alpha_warmup": 10,
                  "beta3_warmup": 10, "weight_decay": 0.01},
    "precision": {"dtype": "float64"},
    "checkpoint": {"every": 3, "keep_last": 100},
    "run": {"max_updates": UPDATES, "device": "cpu"},
}
INSIDE = {"torch": ("micro_batch", {"update": 8, "index": 0}), "jax": ("dispatched", {"update": 8})}


def train(framework: str, out: Path, **kw: Any) -> Any:
    return importlib.import_module(f"ref_{framework}.trainer").train(load_config(ADEMAMIX), out, progress="none", **kw)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, persistent_xla_cache: Any, one_thread: Any) -> dict:
    """Each trainer's uninterrupted AdEMAMix run, every checkpoint kept."""
    tmp = tmp_path_factory.mktemp("ademamix")
    config = tmp / "run.toml"
    config.write_text(tomlio.dumps(ADEMAMIX))
    out: dict[str, Path] = {"config": config}
    for name in FRAMEWORKS:
        train(name, tmp / name)
        out[name] = tmp / name
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_ademamix_killed_inside_a_warm_up_update_resumes_bit_exact(runs: dict, tmp_path: Path,
                                                                   framework: str) -> None:
    saved = ck.load_checkpoint(runs[framework] / "checkpoints" / ck.step_name(CUT)).state
    entry = next(iter(saved.optimizer.values()))
    assert {"m", "m_slow", "v"} <= set(entry) and int(entry["step"]) == CUT  # what the resume must restore
    out = tmp_path / "run"
    name, point = INSIDE[framework]
    cmd = [*fault_args(name, **point), "train", str(runs["config"]), "--backend", framework, "--out", str(out),
           "--progress", "none"]
    done = run_process(cmd, "die inside update 8", PROCESS_S, capture_output=True, text=True,
                       env=child_env())
    assert done.returncode == 137, done.stderr[-2000:]  # killed as SIGKILL would, inside update 8
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")][0] == CUT  # newest first
    train(framework, out, resume=True)
    assert differences(runs[framework], out, UPDATES) == []


def _counts_lost(checkpoint: ck.Checkpoint) -> ck.Checkpoint:
    state = checkpoint.state
    lost = {p: {**e, "step": np.zeros_like(e["step"])} for p, e in state.optimizer.items()}
    return checkpoint._replace(state=state._replace(optimizer=lost))


@pytest.mark.parametrize("piece", ["none", "optimizer", "counts"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_resume_that_forgets_the_state_or_its_counts_is_caught(runs: dict, tmp_path: Path, framework: str,
                                                                 monkeypatch: pytest.MonkeyPatch, piece: str) -> None:
    out = cut_after(runs[framework], tmp_path / "cut", CUT)
    calls: list[int] = []
    real = session.pick_checkpoint

    def pick(*args: Any) -> Any:  # planted after the checkpoint verified
        calls.append(1)
        found = real(*args)
        if piece == "none":
            return found
        return forgotten(found, "optimizer") if piece == "optimizer" else _counts_lost(found)

    monkeypatch.setattr(session, "pick_checkpoint", pick)
    train(framework, out, resume=True)
    assert calls, "the planted bug was never reached"
    assert (differences(runs[framework], out, UPDATES) != []) is (piece != "none")
