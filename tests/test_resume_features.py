"""The stateful features (schedule-free, EMA, reduce_on_plateau) under the resume machinery, together, on both trainers
(`[torch]`, `[jax]`), each check with its negative control:

- reduce_on_plateau + [ema] (evaluations on the EMA, so the plateau observes the EMA's val_loss) +
  a checkpoint every 3 updates: a real `twinstep train` process killed (SIGKILL, exit 137) inside
  update 16 resumes bit for bit (tests/support/resume.py: weights, EMA, optimizer state, counters,
  the plateau state, every metrics line), and so does one stopped by SIGTERM inside update 16
  (a checkpoint at 17, between the periodic ones). Controls: resumes that forget the plateau state or the
  EMA (planted after the checkpoint verified) fail the same comparison.
- SIGTERM preemption with a schedule-free optimizer and an [ema], with checkpoint.every = 0: the
  run stops after the update it was in, with a checkpoint there, and the resume equals the
  uninterrupted run bit for bit, whether evaluations see x or the EMA (between updates the trainers
  hold x, so a save or an evaluation changes nothing: checked too). Controls: a resume one rounding
  off (one weight of the restored x one ulp away), and a resume that forgets the EMA, are caught.
- `twinstep checkpoint verify` accepts the checkpoints of both runs (ema.safetensors and
  schedule.plateau included) and refuses, naming the field, each re-hashed tampering of them
  (tests/support/tamper.py: every hash rewritten, so only conformance.run.validate can tell).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.faults import fault_args
from support.processes import PROCESS_S, child_env, run_process
from support.resume import cut_after, differences, forgotten
from support.tamper import edit_state, edit_tensors, rehash_manifest

from conformance import checkpoint as ck
from conformance import tomlio
from conformance.cli import main
from conformance.config import load_config
from conformance.errors import Preempted
from conformance.run import session

pytestmark = pytest.mark.usefixtures("persistent_xla_cache", "one_thread")
FRAMEWORKS = ("torch", "jax")
UPDATES, CUT = 24, 15
PLATEAU_EMA: dict[str, Any] = {
    "model": {"name": "linear"},
    "data": {"name": "linear_regression", "batch_size": 16, "val_fraction": 0.25},
    "loss": {"name": "mse"},
    "optimizer": {"name": "sgd", "lr": 0.3, "momentum": 0.5},
    "schedule": {"name": "reduce_on_plateau", "factor": 0.5, "patience": 1, "cooldown": 1, "threshold": 0.02,
                 "threshold_mode": "abs"},
    "precision": {"dtype": "float64"},
    "ema": {"decay": 0.7, "every": 2, "start": 3, "evaluate": True},
    "checkpoint": {"every": 3, "keep_last": 100},
    "run": {"max_updates": UPDATES, "eval_every": 1, "device": "cpu"},
}
INSIDE = {"torch": ("micro_batch", {"update": 16, "index": 0}), "jax": ("dispatched", {"update": 16})}
PREEMPT_UPDATES, AT = 10, 3  # the signal arrives inside update 3: a checkpoint at 4 (no eval there)


def schedule_free(evaluate: bool) -> dict[str, Any]:
    """An MLP on digits (float32, 1.4k weights: a rounding of y anywhere shows), schedule-free AdamW,
    an EMA from update 1, evaluations every 3 updates, no periodic checkpoint."""
    return {"model": {"name": "mlp", "hidden": [16]}, "data": {"name": "digits", "batch_size": 32},
            "loss": {"name": "cross_entropy"},
            "optimizer": {"name": "schedule_free_adamw", "lr": 0.01, "warmup_steps": 2, "weight_decay": 0.01},
            "ema": {"decay": 0.8, "start": 1, "evaluate": evaluate}, "checkpoint": {"every": 0},
            "run": {"max_updates": PREEMPT_UPDATES, "eval_every": 3, "device": "cpu"}}


def train(framework: str, config: dict[str, Any], out: Path, **kw: Any) -> Any:
    return importlib.import_module(f"ref_{framework}.trainer").train(load_config(config), out, progress="none", **kw)


def lrs(run: Path) -> list[float]:
    lines = (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines())
    return [r["lr"][0] for r in lines if r.get("event") == "update"]


@pytest.fixture(scope="module")
def plateau_runs(tmp_path_factory: pytest.TempPathFactory, persistent_xla_cache: Any, one_thread: Any) -> dict:
    """Each trainer's uninterrupted reduce_on_plateau + [ema] run, every checkpoint kept."""
    tmp = tmp_path_factory.mktemp("plateau-ema")
    config = tmp / "run.toml"
    config.write_text(tomlio.dumps(PLATEAU_EMA))
    out: dict[str, Path] = {"config": config}
    for name in FRAMEWORKS:
        train(name, PLATEAU_EMA, tmp / name)
        out[name] = tmp / name
    return out


def _env() -> dict[str, str]:
    return child_env()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_plateau_moves_before_and_after_the_cut(plateau_runs: dict, framework: str) -> None:
    # what makes the checks below meaningful: the lr changes on both sides of the resumed checkpoint,
    # and the EMA exists in it
    seen = lrs(plateau_runs[framework])
    changes = [t for t in range(1, UPDATES) if seen[t] != seen[t - 1]]
    assert any(t <= CUT for t in changes) and any(t > CUT for t in changes), changes
    saved = ck.load_checkpoint(plateau_runs[framework] / "checkpoints" / ck.step_name(CUT)).state
    assert saved.ema is not None and saved.meta["schedule"]["plateau"]["observed"] == CUT


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_plateau_and_ema_killed_inside_an_update_resume_bit_exact(plateau_runs: dict, tmp_path: Path,
                                                                  framework: str) -> None:
    out = tmp_path / "run"
    name, point = INSIDE[framework]
    cmd = [*fault_args(name, **point), "train", str(plateau_runs["config"]), "--backend", framework, "--out",
           str(out), "--progress", "none"]
    done = run_process(cmd, "die inside update 16", PROCESS_S, env=_env(), capture_output=True, text=True)
    assert done.returncode == 137, done.stderr[-2000:]  # killed as SIGKILL would, inside update 16
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")][0] == 15
    train(framework, PLATEAU_EMA, out, resume=True)
    assert differences(plateau_runs[framework], out, UPDATES) == []


def plant_forgetting(monkeypatch: pytest.MonkeyPatch, piece: str) -> list[int]:
    """The resume forgets `piece` after its checkpoint verified (support/resume.py `forgotten`)."""
    calls: list[int] = []
    real = session.pick_checkpoint

    def pick(*args: Any) -> Any:
        calls.append(1)
        return forgotten(real(*args), piece)

    monkeypatch.setattr(session, "pick_checkpoint", pick)
    return calls


@pytest.mark.parametrize("piece", ["none", "plateau", "ema"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_resume_that_forgets_the_plateau_or_the_ema_is_caught(plateau_runs: dict, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch, framework: str,
                                                                piece: str) -> None:
    out = cut_after(plateau_runs[framework], tmp_path / "cut", CUT)
    calls = plant_forgetting(monkeypatch, piece) if piece != "none" else [1]
    train(framework, PLATEAU_EMA, out, resume=True)
    assert calls, "the planted bug was never reached"
    assert (differences(plateau_runs[framework], out, UPDATES) != []) is (piece != "none")


# ---------------------------------------------------------------------------------------------
# SIGTERM with a schedule-free optimizer and an EMA, checkpoint.every = 0
# ---------------------------------------------------------------------------------------------


def signal_inside(framework: str, update: int, signum: int = signal.SIGTERM) -> Callable[[str, Any], None]:
    name, want = ("micro_batch", {"update": update, "index": 0}) if framework == "torch" else (
        "dispatched", {"update": update})

    def observe(event: str, info: Any) -> None:
        if event == name and all(info.get(k) == v for k, v in want.items()):
            os.kill(os.getpid(), signum)

    return observe


@pytest.fixture(scope="module")
def free_runs(tmp_path_factory: pytest.TempPathFactory, persistent_xla_cache: Any, one_thread: Any) -> dict:
    """Each trainer's uninterrupted schedule-free + [ema] run, for evaluations at x and on the EMA."""
    tmp = tmp_path_factory.mktemp("free-ema")
    return {(f, e): train(f, schedule_free(e), tmp / f"{f}-{e}").out_dir for f in FRAMEWORKS for e in (False, True)}


def preempt_and_resume(framework: str, evaluate: bool, out: Path) -> None:
    config = schedule_free(evaluate)
    with pytest.raises(Preempted) as stop:
        train(framework, config, out, events=signal_inside(framework, AT))
    assert stop.value.updates_done == AT + 1
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")] == [AT + 1]
    train(framework, config, out, resume=True)


@pytest.mark.parametrize("evaluate", [False, True], ids=["eval-at-x", "eval-on-ema"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_schedule_free_and_ema_preempted_resume_bit_exact(free_runs: dict, tmp_path: Path, framework: str,
                                                           evaluate: bool) -> None:
    out = tmp_path / "run"
    preempt_and_resume(framework, evaluate, out)
    saved = ck.load_checkpoint(out / "checkpoints" / ck.step_name(AT + 1)).state
    assert saved.ema is not None and "z" in next(iter(saved.optimizer.values()))
    assert differences(free_runs[(framework, evaluate)], out, PREEMPT_UPDATES) == []


def final_tensors(run: Path, updates: int) -> dict[str, np.ndarray]:
    state = ck.load_checkpoint(run / "checkpoints" / ck.step_name(updates)).state
    out = {f"model {k}": v for k, v in state.model.items()} | {f"ema {k}": v for k, v in (state.ema or {}).items()}
    return out | {f"optimizer {p} {k}": v for p, e in state.optimizer.items() for k, v in e.items()}


def same_tensors(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_saves_and_evaluations_leave_a_schedule_free_run_unchanged(free_runs: dict, tmp_path: Path,
                                                                   framework: str) -> None:
    # what makes a preemption at any update exact: between updates the trainer holds x, and an
    # evaluation or a save reads it as it is (schedulefree's eval()/train() pair would round y)
    config = {**schedule_free(False), "checkpoint": {"every": 1, "keep_last": 1}}
    config["run"] = {**config["run"], "eval_every": 1}
    train(framework, config, tmp_path / "run")
    reference = final_tensors(free_runs[(framework, False)], PREEMPT_UPDATES)
    assert same_tensors(final_tensors(tmp_path / "run", PREEMPT_UPDATES), reference)


def _one_ulp_off(checkpoint: ck.Checkpoint) -> ck.Checkpoint:
    """The checkpoint with one weight of x one ulp off: what a single rounding of the restored point
    does (schedulefree's eval()/train() pair rounds about 60 % of float64 weights)."""
    model = dict(checkpoint.state.model)
    name = sorted(model)[0]
    flat = model[name].copy().reshape(-1)
    flat[0] = np.nextafter(flat[0], np.inf)
    model[name] = flat.reshape(model[name].shape)
    return checkpoint._replace(state=checkpoint.state._replace(model=model))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_negative_control_a_resume_one_rounding_off_is_caught(free_runs: dict, tmp_path: Path, framework: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    with pytest.raises(Preempted):
        train(framework, schedule_free(False), out, events=signal_inside(framework, AT))
    real, calls = session.pick_checkpoint, []
    monkeypatch.setattr(session, "pick_checkpoint", lambda *a: calls.append(1) or _one_ulp_off(real(*a)))
    train(framework, schedule_free(False), out, resume=True)
    assert calls and differences(free_runs[(framework, False)], out, PREEMPT_UPDATES) != []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_negative_control_a_preempted_resume_without_the_ema_is_caught(free_runs: dict, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      framework: str) -> None:
    out = tmp_path / "run"
    with pytest.raises(Preempted):
        train(framework, schedule_free(True), out, events=signal_inside(framework, AT))
    calls = plant_forgetting(monkeypatch, "ema")
    train(framework, schedule_free(True), out, resume=True)
    assert calls and differences(free_runs[(framework, True)], out, PREEMPT_UPDATES) != []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_plateau_and_ema_preempted_between_checkpoints_resume_bit_exact(plateau_runs: dict, tmp_path: Path,
                                                                        framework: str) -> None:
    # SIGTERM inside update 16: the run stops after it with a checkpoint at 17 (not a multiple of 3),
    # holding the plateau's state after its 17th observation and the EMA
    out = tmp_path / "run"
    with pytest.raises(Preempted) as stop:
        train(framework, PLATEAU_EMA, out, events=signal_inside(framework, 16))
    assert stop.value.updates_done == 17
    saved = ck.load_checkpoint(out / "checkpoints" / ck.step_name(17)).state
    assert saved.ema is not None and saved.meta["schedule"]["plateau"]["observed"] == 17
    train(framework, PLATEAU_EMA, out, resume=True)
    assert differences(plateau_runs[framework], out, UPDATES) == []


# ---------------------------------------------------------------------------------------------
# `twinstep checkpoint verify` on checkpoints with ema.safetensors and schedule.plateau
# ---------------------------------------------------------------------------------------------


def verify(capsys: pytest.CaptureFixture, path: Path) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["checkpoint", "verify", str(path)])
    return code, capsys.readouterr().out.strip().splitlines()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_verify_accepts_checkpoints_with_an_ema_and_a_plateau(plateau_runs: dict, free_runs: dict,
                                                              capsys: pytest.CaptureFixture, framework: str) -> None:
    for run in (plateau_runs[framework], free_runs[(framework, True)]):
        code, lines = verify(capsys, run)
        assert code == 0 and lines and all(": verified" in line for line in lines), lines
    assert (plateau_runs[framework] / "checkpoints" / ck.step_name(CUT) / "ema.safetensors").is_file()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        *head, last = path.split(".")
        table = meta
        for key in head:
            table = table[key]
        if value is _DROP:
            del table[last]
        else:
            table[last] = value

    return change


_DROP = object()


def _drop_ema(step: Path) -> None:  # ema.safetensors deleted, the manifest re-hashed without it
    (step / "ema.safetensors").unlink()
    m = json.loads((step / "manifest.json").read_bytes())
    del m["files"]["ema.safetensors"]
    (step / "manifest.json").write_bytes(json.dumps(m).encode())
    rehash_manifest(step)


def _ema_tensor(change: Callable[[np.ndarray], np.ndarray]) -> Callable[[Path], None]:
    def tamper(step: Path) -> None:
        edit_tensors(step, "ema.safetensors", lambda t: t.update({k: change(v) for k, v in t.items()}))

    return tamper


TAMPERING: dict[str, tuple[Callable[[Path], None], str]] = {
    "plateau-missing": (lambda s: edit_state(s, _set("schedule.plateau", _DROP)), "state.json has no schedule.plateau"),
    "plateau-unknown-key": (lambda s: edit_state(s, _set("schedule.lr", 0.1)), "schedule.lr is not a field"),
    "plateau-lr-raised": (lambda s: edit_state(s, _set("schedule.plateau.lrs", [3.0])), "schedule.plateau.lrs[0]"),
    "plateau-bad-epochs": (lambda s: edit_state(s, _set("schedule.plateau.num_bad_epochs", 7)),
                           "schedule.plateau.num_bad_epochs"),
    "plateau-cooldown": (lambda s: edit_state(s, _set("schedule.plateau.cooldown_counter", 2)),
                         "schedule.plateau.cooldown_counter"),
    "plateau-observed": (lambda s: edit_state(s, _set("schedule.plateau.observed", 99)), "schedule.plateau.observed"),
    "plateau-best-nan": (lambda s: edit_state(s, _set("schedule.plateau.best", "nan")), "schedule.plateau.best"),
    "plateau-negative": (lambda s: edit_state(s, _set("schedule.plateau.num_bad_epochs", -1)), "schedule.plateau"),
    "ema-missing": (_drop_ema, "ema.safetensors is missing"),
    "ema-nan": (_ema_tensor(lambda v: np.full_like(v, np.nan)), "holds non-finite values"),
    "ema-dtype": (_ema_tensor(lambda v: v.astype(np.float32)), "must be float64"),
    "ema-shape": (_ema_tensor(lambda v: np.zeros((*v.shape, 2), v.dtype)), "of shape"),
}


@pytest.mark.parametrize("tampering", list(TAMPERING))
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_verify_refuses_a_rehashed_tampering_naming_the_field(plateau_runs: dict, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture, framework: str,
                                                              tampering: str) -> None:
    step = tmp_path / ck.step_name(CUT)
    shutil.copytree(plateau_runs[framework] / "checkpoints" / ck.step_name(CUT), step)
    assert verify(capsys, step)[0] == 0  # the control: the untouched copy verifies
    tamper, field = TAMPERING[tampering]
    tamper(step)
    ck.load_checkpoint(step)  # every hash matches: only the state's own checks can refuse it
    code, lines = verify(capsys, step)
    assert code == 1 and len(lines) == 1 and "refused" in lines[0] and field in lines[0], lines


# ---------------------------------------------------------------------------------------------
# a user's model with buffers, an [ema] and reduce_on_plateau, under the field checks
# ---------------------------------------------------------------------------------------------


def user_run(framework: str, out: Path, resume: bool = False) -> Any:
    from support.user_models import blobs, config, model

    spec = config(8)
    spec.update(schedule={"name": "reduce_on_plateau", "patience": 0}, ema={"decay": 0.9, "start": 2},
                checkpoint={"every": 4, "keep_last": 10}, run={**spec["run"], "eval_every": 2, "inject_nonfinite": [3]})
    return importlib.import_module(f"ref_{framework}.trainer").train(
        load_config(spec), out, model=model(framework), data=blobs(), progress="none", resume=resume)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_user_models_checkpoint_verifies_and_a_missing_parameter_entry_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture, framework: str) -> None:
    from conformance.errors import CheckpointError

    full = user_run(framework, tmp_path / "full")
    code, lines = verify(capsys, tmp_path / "full")  # buffers have no optimizer entry: still verified
    assert code == 0 and len(lines) == 2 and all(": verified" in line for line in lines), lines
    for tampered in (False, True):
        out = tmp_path / f"cut-{tampered}"
        shutil.copytree(tmp_path / "full", out)
        shutil.rmtree(out / "checkpoints" / ck.step_name(8))
        if tampered:  # a trainable parameter's optimizer entry dropped, every hash rewritten
            step = out / "checkpoints" / ck.step_name(4)
            first = sorted(full.params)[0]
            edit_tensors(step, "optimizer.safetensors",
                         lambda t: [t.pop(k) for k in [k for k in t if k.startswith(f"optimizer/{first}/")]])
            with pytest.raises(CheckpointError, match=f"optimizer.safetensors: optimizer/{first} is missing"):
                user_run(framework, out, resume=True)
        else:  # the control: the untouched checkpoint resumes to the same weights
            resumed = user_run(framework, out, resume=True)
            assert all(np.array_equal(resumed.params[k], full.params[k]) for k in full.params)
