"""The newer optimizers' state under a hard kill, on both trainers (`[torch]`, `[jax]`): AdEMAMix
keeps a per-parameter update count that its α and β3 warm-ups read, and a slow EMA besides Adam's
two; Prodigy keeps one d for every parameter (with d_max, its numerator and count), each
parameter's start p0 and the sum s. A real `twinstep train` process killed (SIGKILL, exit 137)
inside update 8, while AdEMAMix's warm-ups are still ramping and Prodigy's d still grows, resumes
from its checkpoint after update 6 and equals the uninterrupted run bit for bit
(tests/support/resume.py: weights, optimizer state, counters, every metrics line).
Controls: resumes that forget the optimizer state, or keep the moments but lose the counts (the
warm-ups read at t = 1 again, Prodigy's p0 taken afresh), or lose Prodigy's shared d, fail the same
comparison.
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
PRODIGY: dict[str, Any] = {**ADEMAMIX, "optimizer": {
    "name": "prodigy", "d0": 1e-4, "weight_decay": 0.01, "use_bias_correction": True, "growth_rate": 1.5,
    "no_weight_decay": ["*.bias"]}, "schedule": {"name": "cosine", "t_max": UPDATES}}
RECIPES = {"ademamix": ADEMAMIX, "prodigy": PRODIGY}
KEPT = {"ademamix": {"m", "m_slow", "v"}, "prodigy": {"m", "v", "s", "p0", "d", "d_max", "d_numerator", "k"}}
INSIDE = {"torch": ("micro_batch", {"update": 8, "index": 0}), "jax": ("dispatched", {"update": 8})}


def train(framework: str, out: Path, recipe: str, **kw: Any) -> Any:
    config = load_config(RECIPES[recipe])
    return importlib.import_module(f"ref_{framework}.trainer").train(config, out, progress="none", **kw)


@pytest.fixture(scope="module", params=sorted(RECIPES))
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, persistent_xla_cache: Any,
         one_thread: Any) -> dict:
    """Each trainer's uninterrupted run of one recipe, every checkpoint kept."""
    recipe = request.param
    tmp = tmp_path_factory.mktemp(recipe)
    config = tmp / "run.toml"
    config.write_text(tomlio.dumps(RECIPES[recipe]))
    out: dict[str, Any] = {"config": config, "recipe": recipe}
    for name in FRAMEWORKS:
        train(name, tmp / name, recipe)
        out[name] = tmp / name
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_killed_inside_an_update_resumes_bit_exact(runs: dict, tmp_path: Path, framework: str) -> None:
    saved = ck.load_checkpoint(runs[framework] / "checkpoints" / ck.step_name(CUT)).state
    entry = next(iter(saved.optimizer.values()))
    assert KEPT[runs["recipe"]] <= set(entry) and int(entry["step"]) == CUT  # what the resume must restore
    out = tmp_path / "run"
    name, point = INSIDE[framework]
    cmd = [*fault_args(name, **point), "train", str(runs["config"]), "--backend", framework, "--out", str(out),
           "--progress", "none"]
    done = run_process(cmd, "die inside update 8", PROCESS_S, capture_output=True, text=True,
                       env=child_env())
    assert done.returncode == 137, done.stderr[-2000:]  # killed as SIGKILL would, inside update 8
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")][0] == CUT  # newest first
    train(framework, out, runs["recipe"], resume=True)
    assert differences(runs[framework], out, UPDATES) == []


def _lost(checkpoint: ck.Checkpoint, start: dict[str, float]) -> ck.Checkpoint:
    state = checkpoint.state
    lost = {p: {**e, **{k: np.full_like(e[k], v) for k, v in start.items()}} for p, e in state.optimizer.items()}
    return checkpoint._replace(state=state._replace(optimizer=lost))


LOST = {"counts": {"step": 0}, "shared": {"d": 1e-4, "d_max": 1e-4, "d_numerator": 0.0, "k": 0.0}}  # prodigy's start


def _resume_with(runs: dict, tmp_path: Path, framework: str, monkeypatch: pytest.MonkeyPatch, piece: str) -> list:
    """The differences from the uninterrupted run of a resume whose checkpoint lost `piece`."""
    out = cut_after(runs[framework], tmp_path / "cut", CUT)
    calls: list[int] = []
    real = session.pick_checkpoint

    def pick(*args: Any) -> Any:  # planted after the checkpoint verified
        calls.append(1)
        found = real(*args)
        if piece == "none":
            return found
        return forgotten(found, "optimizer") if piece == "optimizer" else _lost(found, LOST[piece])

    monkeypatch.setattr(session, "pick_checkpoint", pick)
    train(framework, out, runs["recipe"], resume=True)
    assert calls, "the planted bug was never reached"
    return differences(runs[framework], out, UPDATES)


@pytest.mark.parametrize("piece", ["none", "optimizer", "counts"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_resume_that_forgets_the_state_or_its_counts_is_caught(runs: dict, tmp_path: Path, framework: str,
                                                                 monkeypatch: pytest.MonkeyPatch, piece: str) -> None:
    assert (_resume_with(runs, tmp_path, framework, monkeypatch, piece) != []) is (piece != "none")


@pytest.mark.parametrize("runs", ["prodigy"], indirect=True)  # the one recipe with a value every parameter shares
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_resume_that_loses_prodigy_s_shared_d_is_caught(runs: dict, tmp_path: Path, framework: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert _resume_with(runs, tmp_path, framework, monkeypatch, "shared") != []
