"""No clean checkpoint is lost to a non-finite one: a checkpoint whose weights hold a NaN (re-hashed,
so its hashes pass) is refused by `checkpoint verify` and by `--resume`, naming the tensor, on both
trainers, and the clean older one stays on disk; a state holding a NaN or an inf is never written,
so keep_last never rotates a finite checkpoint away for it."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.tamper import edit_tensors
from support.trainers import FRAMEWORKS

from conformance import checkpoint as ck
from conformance.cli import main
from conformance.config import load_config
from conformance.errors import TwinstepWarning
from conformance.rules.inputs import first_nonfinite
from conformance.run import records
from conformance.run.loop import open_on_every_rank
from conformance.run.session import Run


def train(capsys: pytest.CaptureFixture, out: Path, framework: str, *sets: str, resume: bool = False) -> int:
    capsys.readouterr()
    args = ["train", "--backend", framework, "--out", str(out), "--progress", "none",
            "--set", "checkpoint.every=2", "--set", "checkpoint.keep_last=2", *(["--resume"] if resume else [])]
    for item in sets:
        args += ["--set", item]
    return main(args)


def poison(step: Path) -> str:
    """A NaN in the first weight of model.safetensors, the manifest re-hashed: what a bad disk or a
    tool that rewrote the file leaves, which no hash can catch."""
    names: list[str] = []

    def change(tensors: dict[str, np.ndarray]) -> None:
        names.append(sorted(tensors)[0])
        tensors[names[0]] = tensors[names[0]].copy()
        tensors[names[0]].flat[0] = np.nan

    edit_tensors(step, "model.safetensors", change)
    return names[0]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_rehashed_nan_checkpoint_is_refused_and_the_clean_one_kept(capsys: pytest.CaptureFixture, tmp_path: Path,
                                                                     framework: str) -> None:
    out = tmp_path / "run"
    assert train(capsys, out, framework, "run.max_updates=4") == 0
    clean, bad = out / "checkpoints" / ck.step_name(2), out / "checkpoints" / ck.step_name(4)
    name = poison(bad)
    capsys.readouterr()
    assert main(["checkpoint", "verify", str(out)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert f"refused: {bad / 'model.safetensors'}: model/{name} holds non-finite values" in lines[0]
    assert lines[1].startswith(f"{clean}: verified")
    assert train(capsys, out, framework, "run.max_updates=8", resume=True) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"model/{name} holds non-finite values" in err[0] and "internal error" not in err[0]
    assert [p.name for _, p in ck.list_checkpoints(out / "checkpoints")] == [bad.name, clean.name]  # nothing rotated
    # with the fallback allowed, the run continues from the clean one and ends finite
    assert train(capsys, out, framework, "run.max_updates=8", "checkpoint.allow_fallback=true", resume=True) == 0


def test_negative_control_the_clean_checkpoint_resumes(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert train(capsys, out, "torch", "run.max_updates=4") == 0
    assert train(capsys, out, "torch", "run.max_updates=6", resume=True) == 0


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Run]:
    config = load_config(overrides=["checkpoint.keep_last=1", "run.max_updates=4"])
    run = open_on_every_rank(lambda ok: ok, config, tmp_path / "run", "torch", progress="none")
    yield run
    run.close()


def _save(run: Run, updates_done: int, bias: float) -> Path | None:
    model = {"0.weight": np.ones((2, 2), np.float32), "0.bias": np.full(2, bias, np.float32)}
    optimizer = {"0.weight": {"exp_avg": np.zeros((2, 2), np.float32)}}
    return records.save(run, updates_done, model, optimizer, {"rng/x": np.zeros(3, np.uint32)}, {}, {})


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_non_finite_state_is_not_written_and_retention_keeps_the_finite_one(opened: Run, value: float) -> None:
    first = _save(opened, 2, 0.5)  # negative control: a finite state is written
    assert first is not None and first.is_dir()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _save(opened, 4, value) is None
    said = [str(w.message) for w in seen if issubclass(w.category, TwinstepWarning)]
    assert said == ["checkpoint after update 4 not written: model/0.bias holds non-finite values, which no resume "
                    "could continue from; the checkpoints already written are kept"]
    assert [p for _, p in ck.list_checkpoints(opened.checkpoint_dir)] == [first]  # keep_last = 1 rotated nothing


def test_first_nonfinite_names_nested_tensors() -> None:
    ok = {"model": {"w": np.ones(3)}, "optimizer": {"w": {"v": np.zeros(3)}}, "ema": {}}
    assert first_nonfinite(ok) is None
    bad = {**ok, "optimizer": {"w": {"v": np.array([0.0, -np.inf])}}}
    assert first_nonfinite(bad) == "optimizer/w/v"
    assert first_nonfinite({"steps": np.array([1, 2], np.int64)}) is None  # integers hold no NaN


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_sharded_save_is_skipped_on_every_rank_when_any_rank_holds_a_nan(opened: Run, bad_rank: int) -> None:
    def pieces(rank: int) -> dict:
        box = np.full((1, 2), np.nan if rank == bad_rank else 1.0, np.float32)
        return {"model/0.weight": (box, (2, 2), (rank, 0))}

    other = 1  # this process is rank 0; the exchange carries what rank 1 found in its own slice
    found_there = first_nonfinite({k: b for k, (b, _, _) in pieces(other).items()}) or ""
    exchange = lambda mine: [mine, found_there.encode("utf-8")]  # noqa: E731 (an all-gather of two ranks)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert records.save_sharded(opened, 2, pieces(0), {}, {}, {}, exchange) is None
    assert [str(w.message) for w in seen if issubclass(w.category, TwinstepWarning)] == [
        "checkpoint after update 2 not written: model/0.weight holds non-finite values, which no resume could "
        "continue from; the checkpoints already written are kept"]
    assert ck.list_checkpoints(opened.checkpoint_dir) == []


def test_negative_control_a_finite_sharded_save_is_written(opened: Run) -> None:
    box = np.ones((2, 2), np.float32)
    path = records.save_sharded(opened, 2, {"model/0.weight": (box, (2, 2), (0, 0))}, {"rng/x": np.zeros(3, np.uint32)},
                                {}, {}, lambda mine: [mine])
    assert path is not None and [p for _, p in ck.list_checkpoints(opened.checkpoint_dir)] == [path]
