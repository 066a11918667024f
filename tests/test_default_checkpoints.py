"""Nothing lost by default: with the default `[checkpoint] every = 500`, a run of a
bundled config killed hard (SIGKILL, exit 137) inside update 700 — after its first default
checkpoint, before its end — resumes from that checkpoint and equals the uninterrupted run bit for
bit, saying where it resumed from; `--resume` into a directory without checkpoints starts at update 0
saying so in one line. Controls: with `every = 0` (the old default) the same kill leaves nothing to
resume from, and the resume's line says it starts fresh."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.faults import fault_args
from support.processes import PROCESS_S, child_env, run_process
from support.resume import differences

from conformance import checkpoint as ck
from conformance.cli import main
from conformance.config import load_config

pytestmark = pytest.mark.usefixtures("one_thread")  # in-process runs as the killed one: one intra-op thread
ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "digits_mlp.toml"  # 900 updates, no [checkpoint] section: the defaults
UPDATES = 900


def test_the_default_cadence_is_500_updates() -> None:
    assert load_config({}).checkpoint.every == 500 and "[checkpoint]" not in CONFIG.read_text()


def _train(out: Path, *extra: str) -> list[str]:
    return ["train", str(CONFIG), "--backend", "torch", "--out", str(out), "--progress", "lines", *extra]


@pytest.mark.parametrize("every", [None, 0], ids=["default", "every-0-control"])
def test_a_default_run_killed_hard_after_its_first_checkpoint_resumes_from_it(tmp_path: Path, every: int | None,
                                                                             capsys: pytest.CaptureFixture) -> None:
    extra = () if every is None else ("--set", f"checkpoint.every={every}")
    killed = tmp_path / "killed"
    done = run_process([*fault_args("micro_batch", update=700, index=0), *_train(killed, *extra)], "die in update 700",
                       PROCESS_S, capture_output=True, text=True,
                       env=child_env())
    assert done.returncode == 137, done.stderr[-2000:]
    saved = [u for u, _ in ck.list_checkpoints(killed / "checkpoints")]
    assert saved == ([500] if every is None else [])
    assert main(_train(killed, "--resume", *extra)) == 0
    err = capsys.readouterr().err
    if every is None:
        assert f"twinstep: note: resumed from {killed / 'checkpoints' / ck.step_name(500)} (update 500)" in err
        assert main(_train(tmp_path / "whole")) == 0
        assert differences(tmp_path / "whole", killed, UPDATES) == []
    else:  # the control: nothing to resume from, and the line says so
        assert f"twinstep: note: --resume: no checkpoint in {killed / 'checkpoints'}; starting at update 0" in err


def test_resume_into_an_empty_directory_says_it_starts_fresh(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "new"
    assert main(["train", "--backend", "torch", "--out", str(out), "--resume", "--progress", "lines",
                 "--set", "run.max_updates=3"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"twinstep: note: --resume: no checkpoint in {out / 'checkpoints'}; starting at update 0"
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")] == [3]
