"""Exact resume (reliability.md §6 T3/T4), one test body for both trainers (`[torch]`, `[jax]`): a
run interrupted anywhere and resumed equals the uninterrupted run bit for bit on the CPU — final
parameters, optimizer state, loss scale, counters and every metrics line.

The run (tests/support/resume.py): a tiny character-level gpt with dropout (torch: the torch RNG
matters; JAX: keys fold_in(key(run.seed), update)), AdamW, warm-up + cosine, clipping,
token-normalized accumulation of 2, dynamic loss scaling with injected overflows (the scale and skip
counters change), a weights' EMA ([ema], evaluations on it), a checkpoint every 4 updates with retention. 40 updates: it crosses two epoch
boundaries (17 updates an epoch).

- Real processes: `python -m conformance train` is killed with SIGKILL at a random moment after
  training has begun (2 per trainer in CI, 24 with -m slow), sometimes twice, and resumed with
  --resume until it finishes; and killed at named points (tests/support/faults.py): inside update
  9's window (torch: after its first micro-batch, a `micro_batch` event; JAX: while the device
  computes it, a `dispatched` event, the whole window being one compiled call) and inside a save (a
  `checkpoint` event: before the manifest, during retention; JAX's retention trial with -m slow);
  more points with -m slow. The JAX processes share a persistent XLA
  compilation cache with this module's in-process runs (a restart loads the compiled step instead
  of compiling it again: the same executable, so the same bits).
- In-process resumes from the reference run cut back to its checkpoint after 20 updates: the plain
  resume equals the reference (so in-process and subprocess runs are the same bits), and the
  negative controls: a resume that forgets the model, the optimizer state, the loss scale, the
  schedule position, the data position or the weights' EMA fails the same check; forgetting the RNG fails it for torch
  (dropout masks come from the restored generator) and changes nothing for JAX, whose randomness is
  a pure function of run.seed and the update.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from support.faults import fault_args
from support.processes import PROCESS_S, wait_for, wait_until
from support.resume import differences, forgotten, write_config

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.data.pipeline import DataPipeline

ROOT = Path(__file__).resolve().parents[1]
UPDATES = 40
CUT = 20  # the in-process resumes start from the checkpoint after this many updates


class Side(NamedTuple):
    """What differs between the trainers here: the event inside update t's window (`index`: the
    micro-batch, for torch) and the trainer module."""

    name: str
    inside: Callable[[int, int], tuple[str, dict[str, Any]]]
    trainer: str


SIDES = {
    "torch": Side("torch", lambda update, index: ("micro_batch", {"update": update, "index": index}),
                  "ref_torch.trainer"),
    "jax": Side("jax", lambda update, index: ("dispatched", {"update": update}), "ref_jax.trainer"),
}


def each_side(argnames: tuple[str, ...], rows: Callable[[Side], list[tuple]]) -> pytest.MarkDecorator:
    """Parametrize over both trainers and, per trainer, rows (id, values[, marks]): ids like `seed-1[jax]`."""
    params = [pytest.param(name, *row[1], id=f"{row[0]}[{name}]", marks=row[2] if len(row) > 2 else ())
              for name, s in SIDES.items() for row in rows(s)]
    return pytest.mark.parametrize(("side", *argnames), params)


both = pytest.mark.parametrize("side", list(SIDES))


@pytest.fixture(autouse=True, scope="module")
def xla_cache(persistent_xla_cache: Path) -> Path:
    """The module's persistent JAX compilation cache (tests/support/trainers.py), in process and in
    the subprocesses (env): each resume of the same config loads the compiled step."""
    return persistent_xla_cache


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    # in-process runs: one intra-op thread, as the subprocesses (tiny ops; 2 shared cores)
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Reference(NamedTuple):
    side: Side
    config: Path
    out: Path
    duration: float  # seconds from the first metrics line to the end of the process
    cache: Path


def env(cache: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TWINSTEP_", "XLA_FLAGS"))}
    e.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT), JAX_COMPILATION_CACHE_DIR=str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return e


def start(ref: Reference | tuple[Side, Path, Path], out: Path, resume: bool, *extra: str,
          fault: tuple[str, dict[str, Any]] | None = None) -> subprocess.Popen:
    s, config, cache = (ref.side, ref.config, ref.cache) if isinstance(ref, Reference) else ref
    head = fault_args(fault[0], **fault[1]) if fault else [sys.executable, "-m", "conformance"]
    cmd = [*head, "train", str(config), "--backend", s.name, "--out", str(out), "--progress", "none", *extra]
    return subprocess.Popen(cmd + (["--resume"] if resume else []), env=env(cache), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def finish(ref: Reference, out: Path) -> None:
    proc = start(ref, out, resume=True)
    _, err = wait_for(proc, "finish the resumed run", PROCESS_S)
    if proc.returncode != 0:
        pytest.fail(f"resume failed with exit {proc.returncode}: {err.decode()[-2000:]}")


def _wait_for_training(proc: subprocess.Popen, out: Path) -> float:
    metrics = out / "metrics.jsonl"
    wait_until(proc, lambda: metrics.exists() and metrics.stat().st_size > 0, f"write a line to {metrics}")
    return time.monotonic()


@pytest.fixture(scope="module")
def references(xla_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Reference]:
    """Each trainer's uninterrupted run, in a subprocess, made once for the module when first asked
    for; it keeps every checkpoint (retention changes no content that the comparison reads), so the
    in-process resumes start from a copy of it."""
    made: dict[str, Reference] = {}

    def get(name: str) -> Reference:
        if name not in made:
            side = SIDES[name]
            tmp = tmp_path_factory.mktemp(f"resume-{name}")
            config = write_config(tmp, UPDATES)
            out = tmp / "reference"
            proc = start((side, config, xla_cache), out, False, "--set", "checkpoint.keep_last=100")
            began = _wait_for_training(proc, out)
            _, err = wait_for(proc, "finish the reference run", PROCESS_S)
            assert proc.returncode == 0, err.decode()[-2000:]
            made[name] = Reference(side, config, out, time.monotonic() - began, xla_cache)
        return made[name]

    return get


@pytest.fixture
def reference(side: str, references: Callable[[str], Reference]) -> Reference:
    """The uninterrupted run of the test's trainer (`side` is its parameter)."""
    return references(side)


# ---------------------------------------------------------------------------------------------
# real processes: random SIGKILLs and named crash points
# ---------------------------------------------------------------------------------------------


def kill_trial(ref: Reference, out: Path, seed: int) -> list[str]:
    """Kill at a random moment of training (once or twice), resume to the end, compare."""
    rng = random.Random(seed)
    resume = False
    for _ in range(1 + (rng.random() < 0.5)):
        proc = start(ref, out, resume=resume)
        if not resume:
            _wait_for_training(proc, out)
        # a resumed process first loads the checkpoint (and the compiled step): allow for it
        time.sleep(rng.uniform(0.0, ref.duration * (1.0 if not resume else 1.5)))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        wait_for(proc, "end", PROCESS_S)
        resume = True
    finish(ref, out)
    return differences(ref.out, out, UPDATES)


@each_side(("seed",), lambda s: [(f"seed-{seed}", (seed,)) for seed in (1, 2)])
def test_random_sigkill_then_resume_is_bit_exact(reference: Reference, tmp_path: Path, seed: int) -> None:
    assert kill_trial(reference, tmp_path / "run", seed) == []


@pytest.mark.slow
@each_side(("seed",), lambda s: [(f"seed-{seed}", (seed,)) for seed in range(100, 124)])
def test_random_sigkill_then_resume_is_bit_exact_long(reference: Reference, tmp_path: Path, seed: int) -> None:
    assert kill_trial(reference, tmp_path / "run", seed) == []


def _point_id(name: str, point: dict[str, Any]) -> str:
    return name + ":" + ",".join(f"{k}={v}" for k, v in point.items())


def _points(points: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, tuple]]:
    return [(_point_id(name, point), (name, point)) for name, point in points]


def faults(s: Side) -> list[tuple]:
    rows = _points([s.inside(9, 1),  # inside update 9's window
                    ("checkpoint", {"stage": "before_manifest"}),
                    ("checkpoint", {"stage": "during_retention"})])
    # JAX's retention trial runs with -m slow (CI time): retention is the checkpoint writer's, which
    # both trainers share, and the torch trial runs it in CI
    return [(*row, pytest.mark.slow) if s.name == "jax" and "during_retention" in row[0] else row for row in rows]


def more_faults(s: Side) -> list[tuple[str, tuple]]:
    return _points([s.inside(0, 0), s.inside(UPDATES - 1, 1),
                    *(("checkpoint", {"stage": stage}) for stage in ("after_first_file", "after_manifest",
                                                                       "after_rename"))])


def fault_trial(ref: Reference, out: Path, name: str, point: dict[str, Any]) -> list[str]:
    proc = start(ref, out, resume=False, fault=(name, point))
    wait_for(proc, f"die at {name} {point}", PROCESS_S)
    assert proc.returncode == 137, f"the fault point {point} was never reached"
    finish(ref, out)
    return differences(ref.out, out, UPDATES)


@each_side(("name", "point"), faults)
def test_crash_at_named_point_then_resume_is_bit_exact(reference: Reference, tmp_path: Path, name: str,
                                                       point: dict[str, Any]) -> None:
    assert fault_trial(reference, tmp_path / "run", name, point) == []


@pytest.mark.slow
@each_side(("name", "point"), more_faults)
def test_crash_at_more_points_then_resume_is_bit_exact(reference: Reference, tmp_path: Path, name: str,
                                                       point: dict[str, Any]) -> None:
    assert fault_trial(reference, tmp_path / "run", name, point) == []


# ---------------------------------------------------------------------------------------------
# The check has teeth: resumes that forget a piece of state fail it (in-process, from a copy of the
# reference run cut back to its checkpoint after CUT updates). Each bug is planted in a function the
# trainer really calls; the plant counts its calls, so a control whose bug is never reached fails.
# ---------------------------------------------------------------------------------------------


def _reached(fn: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fn(*args, **kwargs)

    return counted


def plant_forgetting(piece: str, monkeypatch: pytest.MonkeyPatch, calls: list[int]) -> None:
    """Make the resume forget `piece` of the state (negative controls only): the data position in
    the pipeline, every other piece in the checkpoint the trainer restores."""
    if piece == "data":  # update t reads the window of t - CUT, as a fresh run would
        real_window = DataPipeline.window
        monkeypatch.setattr(DataPipeline, "window", _reached(lambda self, t: real_window(self, t - CUT), calls))
        return
    # after the checkpoint verified to the last field, as a trainer that forgot to restore the piece
    # would run (a checkpoint missing a piece is itself refused: tests/test_checkpoint_fields.py)
    from conformance.run import session

    real_pick = session.pick_checkpoint
    monkeypatch.setattr(session, "pick_checkpoint", _reached(lambda *a: forgotten(real_pick(*a), piece), calls))


def resume_in_process(ref: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      forget: str | None) -> list[str]:
    import importlib

    out = tmp_path / "run"
    shutil.copytree(ref.out, out)
    for update, path in ck.list_checkpoints(out / "checkpoints"):
        if update > CUT:
            shutil.rmtree(path)
    calls: list[int] = []
    if forget is not None:
        plant_forgetting(forget, monkeypatch, calls)
    train = importlib.import_module(ref.side.trainer).train
    train(load_config(ref.config, ["checkpoint.keep_last=100"]), out, resume=True, progress="none")
    assert forget is None or calls, f"the planted bug (forgetting the {forget}) was never reached"
    return differences(ref.out, out, UPDATES)


@both
def test_in_process_resume_is_bit_exact(reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resume_in_process(reference, tmp_path, monkeypatch, None) == []


@each_side(("forget",), lambda s: [(piece, (piece,)) for piece in ("model", "optimizer", "loss_scale", "schedule",
                                                                  "data", "ema")])
def test_resume_that_forgets_state_is_caught(reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             forget: str) -> None:
    assert resume_in_process(reference, tmp_path, monkeypatch, forget) != []


# torch: dropout masks come from the restored generators; JAX: from fold_in(key(run.seed), update)
RNG_IS_STATE = {"torch": True, "jax": False}


@both
def test_forgetting_the_rng_is_caught_where_the_rng_is_state(reference: Reference, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    found = resume_in_process(reference, tmp_path, monkeypatch, "rng")
    assert (found != []) is RNG_IS_STATE[reference.side.name], found
