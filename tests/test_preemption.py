"""Preemption (conformance/run/preempt.py): SIGTERM / SIGINT finish the current update, save
a checkpoint, and stop with exit status 143 / 130 and a line saying where; `--resume` from it equals
the uninterrupted run bit for bit (CPU), on both trainers, with `checkpoint.every = 0` (the default:
without this a preempted run lost everything).

- In process, at an exact moment: the run sends itself the signal from its `events` observer inside
  update 3 (torch: before micro-batch 0; JAX: while the device computes the update), so the stop
  after update 3 is exact: a checkpoint at update 4, the resumed run equal to the uninterrupted one
  in every parameter, optimizer moment, counter and metrics line.
- As a user sees it: a real `twinstep train` process gets SIGTERM / SIGINT from outside once
  training has begun: one line naming the checkpoint, exit 143 / 130, and the resume completes it.
- Under torchrun (slow): only rank 1 gets the signal; both ranks stop after the same update.
- Negative control: a run that ignores the request (the check after each update answers no) goes
  on to the end, and the test's "stopped at update 4" check fails for it.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.faults import fault_args
from support.processes import PROCESS_S, run_process, wait_for, wait_until
from support.resume import differences
from support.trainers import FRAMEWORKS, gpt_dropout

from conformance import checkpoint as ck
from conformance import tomlio
from conformance.config import load_config
from conformance.errors import Preempted
from conformance.run.metrics import read_metrics, updates
from conformance.run.resume import load_valid
from conformance.run.session import Run

pytestmark = pytest.mark.usefixtures("persistent_xla_cache")  # JAX: compile the step once, not per run
ROOT = Path(__file__).resolve().parents[1]
UPDATES = 8
AT = 3  # the signal arrives inside update 3: the run stops after it, with 4 updates done


def config(tmp: Path) -> dict[str, Any]:
    data = gpt_dropout(tmp)  # dropout: the torch generator is state a resume must restore
    return {**data, "run": {**data["run"], "max_updates": UPDATES, "eval_every": 3}, "checkpoint": {"every": 0}}


def inside(framework: str, update: int) -> tuple[str, dict[str, Any]]:
    return ("micro_batch", {"update": update, "index": 0}) if framework == "torch" else ("dispatched", {"update": update})


def signal_inside(framework: str, update: int, signum: int) -> Any:
    name, want = inside(framework, update)

    def observe(event: str, info: Any) -> None:
        if event == name and all(info.get(k) == v for k, v in want.items()):
            os.kill(os.getpid(), signum)

    return observe


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory, one_thread: Any) -> dict[str, tuple[Path, dict[str, Any]]]:
    out = {}
    for framework in FRAMEWORKS:
        base = tmp_path_factory.mktemp(f"preempt-{framework}")
        cfg = config(base)
        importlib.import_module(f"ref_{framework}.trainer").train(load_config(cfg), base / "run", progress="none")
        out[framework] = (base / "run", cfg)
    return out


def train(framework: str, cfg: dict[str, Any], out: Path, **kw: Any) -> Any:
    return importlib.import_module(f"ref_{framework}.trainer").train(load_config(cfg), out, progress="none", **kw)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_signal_saves_the_update_and_the_resume_is_bit_exact(references: dict[str, Any], tmp_path: Path,
                                                              framework: str, signum: int) -> None:
    ref, cfg = references[framework]
    out = tmp_path / "run"
    before = signal.getsignal(signum)
    with pytest.raises(Preempted) as stop:
        train(framework, cfg, out, events=signal_inside(framework, AT, signum))
    assert signal.getsignal(signum) == before  # the run's handler is gone
    exc = stop.value
    assert (exc.signal, exc.exit_status, exc.updates_done) == (signum, 128 + signum, AT + 1)
    assert exc.checkpoint == out / "checkpoints" / ck.step_name(AT + 1) and str(exc.checkpoint) in str(exc)
    assert f"stopped by {signal.Signals(signum).name} after update {AT + 1} of {UPDATES}" in str(exc)
    load_valid(exc.checkpoint)  # atomic and verified like every checkpoint
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")] == [AT + 1]
    assert len(updates(read_metrics(out / "metrics.jsonl"))) == AT + 1
    result = train(framework, cfg, out, resume=True)
    assert len(result.losses) == UPDATES - AT - 1
    assert differences(ref, out, UPDATES) == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_negative_control_a_run_that_ignores_the_signal_runs_to_the_end(references: dict[str, Any], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       framework: str) -> None:
    _, cfg = references[framework]
    monkeypatch.setattr(Run, "stop_requested", lambda self: False)
    result = train(framework, cfg, tmp_path / "run", events=signal_inside(framework, AT, signal.SIGTERM))
    assert result.updates_done == UPDATES  # what the test above would catch: no stop, no checkpoint at 4
    assert [u for u, _ in ck.list_checkpoints(tmp_path / "run" / "checkpoints")] == [UPDATES]


def test_a_signal_after_the_last_update_ends_the_run_normally(references: dict[str, Any], tmp_path: Path) -> None:
    _, cfg = references["torch"]
    result = train("torch", cfg, tmp_path / "run", events=signal_inside("torch", UPDATES - 1, signal.SIGTERM))
    assert result.updates_done == UPDATES and result.checkpoint.name == ck.step_name(UPDATES)


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "RANK", "WORLD_SIZE", "MASTER_"))}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return e


@pytest.mark.parametrize("framework, signum", [("torch", signal.SIGTERM), ("jax", signal.SIGINT)])
def test_the_cli_prints_where_it_saved_and_exits_128_plus_signal(references: dict[str, Any], tmp_path: Path,
                                                                framework: str, signum: int) -> None:
    ref, cfg = references[framework]
    path = tmp_path / "config.toml"
    path.write_text(tomlio.dumps({**cfg, "run": {**cfg["run"], "max_updates": 400}}))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "conformance", "train", str(path), "--backend", framework, "--out", str(out),
           "--progress", "none"]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    wait_until(proc, lambda: metrics.exists() and metrics.read_text().count("\n") >= 3,
               f"write 3 lines to {metrics}", poll=0.05)
    proc.send_signal(signum)
    _, err = wait_for(proc, f"stop after {signal.Signals(signum).name}", PROCESS_S)
    lines = err.strip().splitlines()
    assert proc.returncode == 128 + signum, err
    assert len(lines) == 1 and lines[0].startswith(f"twinstep: stopped by {signal.Signals(signum).name} after update ")
    assert "Traceback" not in err and "internal error" not in err
    done = int(lines[0].split("after update ")[1].split()[0])
    step = out / "checkpoints" / ck.step_name(done)
    assert f"checkpoint {step}; continue with --resume" in lines[0]
    load_valid(step)
    assert len(updates(read_metrics(out / "metrics.jsonl"))) == done


def torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return run_process(cmd, "end", PROCESS_S, env=env(), capture_output=True, text=True)


@pytest.mark.slow
def test_under_torchrun_every_rank_stops_after_the_same_update(references: dict[str, Any], tmp_path: Path) -> None:
    _, cfg = references["torch"]
    path = tmp_path / "config.toml"
    path.write_text(tomlio.dumps(cfg))
    train_args = ["train", str(path), "--backend", "torch", "--progress", "none"]
    full = torchrun("-m", "conformance", *train_args, "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr[-3000:]
    out = tmp_path / "run"
    script = fault_args("micro_batch", signal="TERM", rank=1, update=AT, index=0)[1:]  # only rank 1 is signalled
    stopped = torchrun(*script, *train_args, "--out", str(out))
    assert stopped.stderr.count(f"stopped by SIGTERM after update {AT + 1} of {UPDATES}") == 2, stopped.stderr[-3000:]
    assert stopped.returncode != 0 and [u for u, _ in ck.list_checkpoints(out / "checkpoints")] == [AT + 1]
    assert load_valid(out / "checkpoints" / ck.step_name(AT + 1)).manifest["world_size"] == 2
    resumed = torchrun("-m", "conformance", *train_args, "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert differences(tmp_path / "full", out, UPDATES) == []
