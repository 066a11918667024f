"""reduce_on_plateau in training, on both trainers (`[torch]`, `[jax]`): it observes the validation
loss at each evaluation, the two trainers apply the same lrs, its state (best, num_bad_epochs,
cooldown_counter, every group's lr) is checkpointed, and a run killed anywhere resumes bit for bit
on the CPU (tests/support/resume.py's comparison: final parameters, optimizer state, counters and
every metrics line, lrs included), also from the other trainer's checkpoint. A resume that forgets
the plateau state fails the same check (negative control). A run that never evaluates is refused.

The run: SGD on y = 3x + 2 in float64, 24 updates, an evaluation after every update, a checkpoint
every 2; the loss flattens (abs threshold 0.02), so the lr halves at updates 13, 16, 20 and 23.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from support.faults import fault_args
from support.processes import PROCESS_S, child_env, run_process
from support.resume import cut_after, differences

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.errors import CheckpointError, ConfigError
from conformance.rules import plateau
from conformance.run.metrics import read_metrics

UPDATES, CUT = 24, 14
CONFIG = f'''
[model]
name = "linear"
[data]
name = "linear_regression"
batch_size = 16
val_fraction = 0.25
[loss]
name = "mse"
[optimizer]
name = "sgd"
lr = 0.3
[schedule]
name = "reduce_on_plateau"
factor = 0.5
patience = 1
cooldown = 1
threshold = 0.02
threshold_mode = "abs"
[precision]
dtype = "float64"
[checkpoint]
every = 2
keep_last = 100
[run]
max_updates = {UPDATES}
eval_every = 1
device = "cpu"
'''
INSIDE = {"torch": ("micro_batch", {"update": 15, "index": 0}), "jax": ("dispatched", {"update": 15})}
FRAMEWORKS = ("torch", "jax")


def _env() -> dict[str, str]:
    return child_env()


def _train(config: Path, backend: str, out: Path, fault: tuple) -> int:
    cmd = [*fault_args(fault[0], **fault[1]), "train", str(config), "--backend", backend, "--out", str(out),
           "--progress", "none"]
    done = run_process(cmd, "die inside update 15", PROCESS_S, env=_env(), capture_output=True, text=True)
    assert done.returncode in (0, 137), done.stderr[-2000:]
    return done.returncode


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> dict[str, Path]:
    """Each trainer's uninterrupted run (in-process, one intra-op thread as the subprocesses), every
    checkpoint kept."""
    tmp = tmp_path_factory.mktemp("plateau")
    config = tmp / "run.toml"
    config.write_text(CONFIG)
    out = {"config": config}
    for name in FRAMEWORKS:
        out[name] = tmp / name
        _resume(config, name, out[name], resume=False)
    return out


def _lrs(run: Path) -> list[float]:
    return [r["lr"][0] for r in read_metrics(run / "metrics.jsonl") if r.get("event") == "update"]


def _plateau_meta(run: Path, update: int) -> dict:
    return ck.load_checkpoint(run / "checkpoints" / ck.step_name(update)).state.meta["schedule"]


def test_both_trainers_apply_the_same_lrs(runs: dict[str, Path]) -> None:
    torch_lrs, jax_lrs = _lrs(runs["torch"]), _lrs(runs["jax"])
    assert torch_lrs == jax_lrs  # 0.3·0.5^k, decided on float64 validation losses
    assert [t for t in range(1, UPDATES) if torch_lrs[t] != torch_lrs[t - 1]] == [13, 16, 20, 23]
    assert torch_lrs[-1] == 0.3 / 16
    a, b = (_plateau_meta(runs[n], UPDATES)["plateau"] for n in FRAMEWORKS)
    assert {**a, "best": None} == {**b, "best": None} and a["best"] == pytest.approx(b["best"], rel=1e-12)
    saved = plateau.from_meta({"schedule": _plateau_meta(runs["jax"], UPDATES)}, 1, "jax")
    assert saved.lrs[0] <= torch_lrs[-1] and saved.observed == UPDATES


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_killed_inside_an_update_resumes_bit_exact(runs: dict[str, Path], tmp_path: Path, name: str) -> None:
    out = tmp_path / "run"
    assert _train(runs["config"], name, out, fault=INSIDE[name]) == 137  # a real process, killed
    _resume(runs["config"], name, out)
    assert differences(runs[name], out, UPDATES) == []
    assert _plateau_meta(out, UPDATES) == _plateau_meta(runs[name], UPDATES)


def _resume(config: Path, name: str, out: Path, resume: bool = True) -> None:
    train = importlib.import_module(f"ref_{name}.trainer").train
    train(load_config(config), out, resume=resume, progress="none")


@pytest.mark.parametrize(("saved", "resumed"), [("torch", "jax"), ("jax", "torch")])
def test_the_other_trainers_checkpoint_resumes_the_plateau(runs: dict[str, Path], tmp_path: Path, saved: str,
                                                           resumed: str) -> None:
    out = cut_after(runs[saved], tmp_path / "cut", CUT)
    _resume(runs["config"], resumed, out)
    assert _lrs(out) == _lrs(runs[saved])
    a, b = _plateau_meta(out, UPDATES)["plateau"], _plateau_meta(runs[saved], UPDATES)["plateau"]
    assert {**a, "best": None} == {**b, "best": None} and a["best"] == pytest.approx(b["best"], rel=1e-12)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_resume_that_forgets_the_plateau_is_caught(runs: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    out = cut_after(runs[name], tmp_path / "cut", CUT)
    real_load, calls = ck.load_checkpoint, []

    def forgetting(path: Path, **kwargs: Any) -> ck.Checkpoint:  # the plateau back at its start: lr 0.3, best +inf
        found = real_load(path, **kwargs)
        meta = dict(found.state.meta)
        meta["schedule"] = {**meta["schedule"], "plateau": plateau.to_json(plateau.Plateau(float("inf"), 0, 0, 0,
                                                                                           (0.3,)))}
        calls.append(1)
        return found._replace(state=found.state._replace(meta=meta))

    monkeypatch.setattr(ck, "load_checkpoint", forgetting)
    _resume(runs["config"], name, out)
    assert calls, "the planted bug was never reached"
    assert differences(runs[name], out, UPDATES) != []


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_checkpoint_without_the_plateau_is_refused(runs: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    out = cut_after(runs[name], tmp_path / "cut", CUT)
    real_load = ck.load_checkpoint

    def without(path: Path, **kwargs: Any) -> ck.Checkpoint:
        found = real_load(path, **kwargs)
        meta = {**found.state.meta, "schedule": {"t": found.state.meta["schedule"]["t"]}}
        return found._replace(state=found.state._replace(meta=meta))

    monkeypatch.setattr(ck, "load_checkpoint", without)
    with pytest.raises(CheckpointError, match="has no schedule.plateau, but this run's schedule is reduce_on_plateau"):
        _resume(runs["config"], name, out)


@pytest.mark.parametrize(("override", "text"), [
    ("run.eval_every=0", "schedule.name = 'reduce_on_plateau' observes the validation metric at each evaluation, "
                         "but run.eval_every = 0 never evaluates"),
    ("data.val_fraction=0.0", "but data.val_fraction leaves no validation samples"),
    ('schedule.monitor="val_accuracy"', "schedule.monitor = 'val_accuracy' needs a classification loss; "
                                        "loss.name = 'mse'"),
])
@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_run_that_cannot_observe_is_refused(tmp_path: Path, name: str, override: str, text: str) -> None:
    config = load_config(_toml(tmp_path), [override])
    with pytest.raises(ConfigError) as info:
        importlib.import_module(f"ref_{name}.trainer").train(config, tmp_path / "out", progress="none")
    assert text in str(info.value) and "\n" not in str(info.value)


def _toml(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    return path
