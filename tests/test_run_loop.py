"""The run's decisions written once (issue 33; conformance/run/loop.py), checked without a framework:

- Opening with every rank agreeing: a rank that fails makes every rank raise; rank 0's refusal is
  seen by the others before they touch the directory; a run already opened when another rank
  failed is closed (its lock released, its signal handlers restored).
- The best validation loss: the lowest finite one; NaN / inf never become the best.
- The checkpoint or stop after an update: saved when due, or when SIGTERM / SIGINT asked any rank
  to stop (then Preempted naming the checkpoint); a request after the last update saves nothing
  extra. Negative controls: the agreement and the stop answer are what decide (a rank whose peers
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
from conformance.run.loop import checkpoint_or_stop, open_on_every_rank, record_evaluation
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
