"""Data files are opened through conformance.files: a FIFO or a device named as data — a
token shard, an .npz, an .npy of a directory, a text corpus, a file to tokenize — is one error line
at once (exit 2 from the CLI, nothing written), never a read that blocks or never ends. Negative
control: the naive open the checks replace blocks on the same FIFO."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_tokens import cli, gpt_config, shard

from conformance import tomlio
from conformance.config import load_config
from conformance.data import DataPipeline
from conformance.data.arrays import open_arrays
from conformance.data.tokenize import tokenize
from conformance.data.tokens import load_tokens
from conformance.errors import TwinstepError

FIFO_SAYS = "is a FIFO (named pipe), not a regular file"


def within(seconds: float, call: Callable[[], Any]) -> tuple[bool, BaseException | None]:
    """The check: does `call` return (or raise) within `seconds`? (finished, the exception raised)"""
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            done.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(done), (done[0] if done else None)


def release(fifo: Path) -> None:
    # a reader blocked in open() on the FIFO returns once a writer opens it (ENXIO: nobody reads it)
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def text_pipeline(path: Path) -> Any:
    return DataPipeline(load_config({"data": {"name": "text", "path": str(path)}, "model": {"name": "gpt",
                                                                                          "block_size": 4}}))


CASES: dict[str, Callable[[Path], Any]] = {
    "tokens": lambda fifo: load_tokens(load_config(gpt_config(str(fifo))).data, 16, 256),
    "npz": lambda fifo: open_arrays(str(fifo), "data.path"),
    "npy-directory": lambda fifo: open_arrays(str(fifo.parent), "data.path"),
    "text": text_pipeline,
    "tokenize": lambda fifo: tokenize([str(fifo)], fifo.parent / "out"),
}
NAMES = {"tokens": "train_000.bin", "npz": "d.npz", "npy-directory": "x.npy", "text": "corpus.txt",
         "tokenize": "corpus.txt"}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fifo_as_data_is_refused_at_once(tmp_path: Path, case: str) -> None:
    where = tmp_path / "d"
    where.mkdir()
    fifo = where / NAMES[case]
    os.mkfifo(fifo)
    finished, error = within(10, lambda: CASES[case](fifo))
    release(fifo)
    assert finished, f"{case}: blocked on the FIFO"
    assert isinstance(error, TwinstepError) and FIFO_SAYS in str(error) and str(fifo) in str(error)
    assert "\n" not in str(error)


def test_a_device_as_data_is_refused_at_once() -> None:
    for case in ("tokens", "text"):
        finished, error = within(10, lambda: CASES[case](Path("/dev/zero")))
        assert finished and isinstance(error, TwinstepError)
        assert "/dev/zero is a character device, not a regular file" in str(error)


def test_twinstep_train_refuses_a_fifo_shard_with_exit_2(tmp_path: Path) -> None:
    fifo = tmp_path / "train_000.bin"
    os.mkfifo(fifo)
    config = tmp_path / "run.toml"
    config.write_text(tomlio.dumps(gpt_config(str(fifo))))
    proc = cli("train", str(config), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr == f"twinstep: error: data.path: {fifo} {FIFO_SAYS}\n"
    assert not (tmp_path / "run").exists()


def test_regular_files_still_open(tmp_path: Path) -> None:
    path = shard(tmp_path / "train_000.bin", np.arange(200) % 256)
    data = load_tokens(load_config(gpt_config(str(path))).data, 16, 256)
    assert len(data.train) > 0 and data.train.take(np.arange(2))["x"].shape == (2, 16)
    np.savez(tmp_path / "a.npz", x=np.ones((3, 2)), y=np.arange(3))
    assert open_arrays(str(tmp_path / "a.npz"), "data.path")["y"].tolist() == [0, 1, 2]


def test_negative_control_a_naive_memmap_blocks_on_the_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "train_000.bin"
    os.mkfifo(fifo)
    finished, _ = within(0.5, lambda: np.memmap(fifo, dtype=np.uint16, mode="r"))  # open() waits for a writer
    assert not finished  # what the checks above avoid
    release(fifo)
