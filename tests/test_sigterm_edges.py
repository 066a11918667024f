"""SIGTERM at the edges of `twinstep train`, where the run's own preemption handling (installed while
the run is open) is not: during start-up the command stops with one line saying nothing was trained
(exit 143) and the directory stays openable; after the run has finished and saved, the work is done
and the command ends as it would have (exit 0, its summary line)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from conformance.cli import main
from conformance.cli import train as cli_train
from conformance.errors import Preempted
from conformance.run import session

ARGS = ["--set", "run.max_updates=3", "--progress", "none"]


def _train(capsys: pytest.CaptureFixture, out: Path, *extra: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["train", "--out", str(out), *ARGS, *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def _term_then(original: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)
    return call


@pytest.mark.parametrize("where", ["before-the-trainer", "directory-claimed"])
def test_sigterm_during_start_up_is_one_line_and_the_directory_stays_openable(
        capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    before = signal.getsignal(signal.SIGTERM)
    if where == "before-the-trainer":
        monkeypatch.setattr(cli_train, "trainer", _term_then(cli_train.trainer))
    else:  # inside open_run, after rank 0 claimed (created and locked) the directory
        monkeypatch.setattr(session, "_open", _term_then(session._open))
    out = tmp_path / "run"
    code, err = _train(capsys, out)
    assert code == 143 and err == ["twinstep: stopped by SIGTERM during start-up; nothing was trained"]
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone with it
    monkeypatch.undo()
    code, err = _train(capsys, out)  # the same directory opens: no lock left behind, nothing to resume
    assert code == 0 and err[-1].startswith("twinstep: trained 3 updates")


def test_sigterm_after_the_final_save_ends_as_the_run_did(capsys: pytest.CaptureFixture, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_train, "_finish", _term_then(cli_train._finish))
    code, err = _train(capsys, tmp_path / "run")
    assert code == 0 and err[-1].startswith("twinstep: trained 3 updates") and "checkpoint" in err[-1]


def test_negative_control_the_outside_handler_stops_only_before_the_work_is_done() -> None:
    outside = cli_train.Outside()
    with pytest.raises(Preempted, match="during start-up; nothing was trained") as stopped:
        outside(signal.SIGTERM, None)
    assert stopped.value.exit_status == 143
    outside.done = True
    assert outside(signal.SIGTERM, None) is None
