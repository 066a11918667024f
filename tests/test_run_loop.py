"""The run's decisions written once (conformance/run/loop.py), checked without a framework:

- Opening with every rank agreeing: a rank that fails makes every rank raise; rank 0's refusal is
  seen by the others before they touch the directory; a run already opened when another rank
  failed is closed (its lock released, its signal handlers restored).
- The best validation loss: the lowest finite one; NaN / inf never become the best.
- The checkpoint or stop after an update: saved when due, or when SIGTERM / SIGINT asked any rank
  to stop (then Preempted naming the checkpoint); a request after the last update saves nothing
  extra.
- The driver (`drive`) with framework steps that only record what they are asked: after every
  update the counters, the metrics line, a due evaluation (then the schedule observes it, then the
  save gets its val_loss), the checkpoint, in that order; a skipped update counted; a signal
  inside an update stops the run after it. Negative controls: the agreement and the stop answer are what decide (a rank whose peers
  answer "no" keeps training; an agreement that says "all fine" opens the run).

The trainers' own runs of these paths: tests/test_preemption.py, tests/test_run_dir.py,
tests/test_data_parallel.py.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance.config import load_config
from conformance.errors import PathError, Preempted, TwinstepError
from conformance.run import loop
from conformance.run.counters import Counters
from conformance.run.loop import (
    Update,
    checkpoint_or_stop,
    drive,
    open_on_every_rank,
    record_evaluation,
)
from conformance.run.metrics import evals, read_metrics
from conformance.run.records import EvalTotals, eval_record
from conformance.run.rundir import claim
from conformance.run.session import Run

UPDATES = 6


def config(every: int = 0) -> Any:
    return load_config({"run": {"max_updates": UPDATES, "eval_every": 2}, "checkpoint": {"every": every}})


def scripted(*answers: bool) -> Any:
    """An agreement whose answers are given in advance (what the other ranks said), recording what
    this rank reported."""
    said: list[bool] = []
    replies: Iterator[bool] = iter(answers)

    def agree(ok: bool) -> bool:
        said.append(ok)
        return ok and next(replies)

    agree.said = said  # type: ignore[attr-defined]
    return agree


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Run]:
    run = open_on_every_rank(scripted(True, True), config(every=2), tmp_path / "run", "torch", progress="none")
    yield run
    run.close()


# --- opening -----------------------------------------------------------------------------------


def test_rank_0_opens_when_every_rank_agrees(tmp_path: Path) -> None:
    agree = scripted(True, True)  # negative control of the refusals below: all fine, the run opens
    run = open_on_every_rank(agree, config(), tmp_path / "run", "torch", rank=0, world_size=2, progress="none")
    try:
        assert agree.said == [True, True] and run.agree is agree and (tmp_path / "run" / "config.toml").is_file()
    finally:
        run.close()


def test_a_run_opened_on_rank_0_is_closed_when_another_rank_failed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TwinstepError, match="^another rank could not open the run"):
        open_on_every_rank(scripted(True, False), config(), out, "torch", rank=0, world_size=2, progress="none")
    assert signal.getsignal(signal.SIGTERM) is before  # its handlers restored
    claim(out, resume=True).release()  # its lock released: the directory can be claimed again


def test_other_ranks_wait_for_rank_0_and_raise_its_failure_without_opening(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(loop, "open_run", lambda *a, **k: calls.append(k["rank"]))
    agree = scripted(False)  # rank 0 reported a failure
    with pytest.raises(TwinstepError, match="^rank 0 could not open the run; see its error"):
        open_on_every_rank(agree, config(), tmp_path / "run", "torch", rank=1, world_size=2, progress="none")
    assert calls == [] and agree.said == [True]


def test_the_failing_rank_raises_its_own_error(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.write_text("a file where the run directory belongs")
    agree = scripted()
    with pytest.raises(PathError, match=f"^--out {out}"):
        open_on_every_rank(agree, config(), out, "torch", rank=0, world_size=2, progress="none")
    assert agree.said == [False]


# --- best validation loss ----------------------------------------------------------------------


def test_the_best_validation_loss_is_the_lowest_finite_one(opened: Run) -> None:
    for t, val in enumerate([2.0, 3.0, math.nan, 1.5, math.inf, 1.75]):
        record_evaluation(opened, eval_record(t + 1, EvalTotals(loss_sum=val * 4, count=4.0)))
    assert opened.counters.best_val_loss == 1.5
    opened.metrics.close()
    assert [r["update"] for r in evals(read_metrics(opened.out_dir / "metrics.jsonl"))] == [1, 2, 3, 4, 5, 6]


def test_a_non_finite_first_evaluation_sets_no_best(opened: Run) -> None:
    record_evaluation(opened, eval_record(1, EvalTotals(loss_sum=math.nan, count=4.0)))
    assert opened.counters.best_val_loss is None


# --- checkpoint or stop ------------------------------------------------------------------------


def test_saves_when_due_and_keeps_the_last_checkpoint(opened: Run, tmp_path: Path) -> None:
    saved: list[int] = []

    def save(done: int) -> Path:
        saved.append(done)
        return tmp_path / f"saved-{done}"

    for t in range(UPDATES):
        checkpoint_or_stop(opened, t, save)
    assert saved == [2, 4, 6] and opened.last_checkpoint == tmp_path / "saved-6"


def test_a_stop_request_saves_after_this_update_and_raises_preempted(opened: Run, tmp_path: Path) -> None:
    saved: list[int] = []
    opened.preemption.signum = signal.SIGTERM  # as the handler records it
    with pytest.raises(Preempted) as exc:
        checkpoint_or_stop(opened, 2, lambda done: saved.append(done) or tmp_path / "ck")  # not due at 3
    assert saved == [3] and exc.value.updates_done == 3 and exc.value.checkpoint == tmp_path / "ck"
    assert "stopped by SIGTERM after update 3 of 6" in str(exc.value)


def test_a_stop_request_after_the_last_update_ends_normally(opened: Run) -> None:
    saved: list[int] = []
    opened.preemption.signum = signal.SIGINT
    checkpoint_or_stop(opened, UPDATES - 1, lambda done: saved.append(done))
    assert saved == [UPDATES]  # the final checkpoint (due), no Preempted


@pytest.mark.parametrize("peers, stops", [(True, False), (False, True)])
def test_any_rank_asking_stops_every_rank(opened: Run, peers: bool, stops: bool) -> None:
    # with several ranks the answer is the agreement's: "all fine" from the peers (negative
    # control: no stop here, nothing asked), or a peer that asked (stop here too)
    opened.world_size, opened.agree = 2, scripted(peers)
    saved: list[int] = []
    if stops:
        with pytest.raises(Preempted, match="stopped by SIGTERM after update 1 of 6"):
            checkpoint_or_stop(opened, 0, lambda done: saved.append(done))
    else:
        checkpoint_or_stop(opened, 0, lambda done: saved.append(done))
    assert saved == ([1] if stops else [])


# --- the driver --------------------------------------------------------------------------------


class Recorder:
    """Framework steps that record what the driver asks of them, in order; update t reports
    loss 10 - t, skipped when t is in `skip`, and validation loss 5 - t (9 after update 3)."""

    device_name = None

    def __init__(self, run: Run, skip: tuple[int, ...] = (), stop_in: int | None = None) -> None:
        self.run, self.skip, self.stop_in, self.calls = run, skip, stop_in, []

    def update(self, t: int) -> Update:
        self.calls.append(("update", t))
        if t == self.stop_in:
            self.run.preemption.signum = signal.SIGTERM  # as if SIGTERM arrived during update t
        skipped = t in self.skip
        info = {"loss": 10.0 - t, "grad_norm": 1.0, "skipped": skipped, "loss_scale": None,
                "schedule_advanced": not skipped}
        return Update(self.run.data.window(t), info, [0.1], 0.0, 0.0)

    def evaluate(self, t: int) -> EvalTotals:
        self.calls.append(("evaluate", t))
        return EvalTotals(loss_sum=(5.0 - t if t != 3 else 9.0) * 2, count=2.0)

    def observe(self, record: Any) -> None:
        self.calls.append(("observe", record["update"]))

    def save(self, updates_done: int, val_loss: float | None) -> Path:
        self.calls.append(("save", updates_done, val_loss))
        return self.run.out_dir / f"saved-{updates_done}"

    def peak_memory_bytes(self) -> int:
        return 1234

    def final_params(self) -> dict[str, Any]:
        self.calls.append(("final",))
        return {"w": 1.0}


def test_the_driver_decides_in_one_order_after_every_update(opened: Run) -> None:
    steps = Recorder(opened, skip=(2,))
    result = drive(opened, steps)
    # config(every=2), eval_every = 2: after updates 1, 3, 5 an evaluation, then a save
    assert steps.calls == [
        ("update", 0), ("update", 1), ("evaluate", 1), ("observe", 1), ("save", 2, 4.0),
        ("update", 2), ("update", 3), ("evaluate", 3), ("observe", 3), ("save", 4, 9.0),
        ("update", 4), ("update", 5), ("evaluate", 5), ("observe", 5), ("save", 6, 0.0), ("final",)]
    assert result.losses == [10.0, 9.0, 8.0, 7.0, 6.0, 5.0] and result.updates_done == UPDATES
    assert result.checkpoint == opened.out_dir / "saved-6" and result.params == {"w": 1.0}
    # the skipped update 2 is counted and does not move the schedule (negative control: skip=())
    assert opened.counters == Counters(UPDATES, UPDATES - 1, 1, 0, 0.0)
    opened.metrics.close()
    lines = read_metrics(opened.out_dir / "metrics.jsonl")
    assert [(r["event"], r["update"]) for r in lines][:4] == [("update", 0), ("update", 1), ("eval", 1), ("update", 2)]
    assert all(r["peak_memory_bytes"] == 1234 for r in lines if r["event"] == "update")


def test_the_driver_stops_after_the_update_a_signal_interrupted(opened: Run) -> None:
    steps = Recorder(opened, stop_in=2)
    with pytest.raises(Preempted, match="stopped by SIGTERM after update 3 of 6"):
        drive(opened, steps)
    assert steps.calls[-2:] == [("update", 2), ("save", 3, None)] and opened.counters.updates_done == 3
