"""docs/your_model.md's three worked examples run as written, at small sizes: the
code blocks are read from the page, only the sizes are cut (UPDATES, max_updates, eval_every), and
`twinstep` is this checkout's `python -m conformance`."""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from support.processes import PROCESS_S, run_process

from conformance.run.metrics import evals, read_metrics, updates

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "your_model.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)


def cut(text: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert old in text, f"docs/your_model.md no longer says {old!r}"
        text = text.replace(old, new)
    return text


def learned(out: Path) -> list[dict[str, Any]]:
    records = read_metrics(out / "metrics.jsonl")
    losses = [r["loss"] for r in updates(records)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    assert evals(records), "no evaluation"
    return records


@pytest.mark.parametrize("example", [0, 1], ids=["torch-module", "nnx-module"])
def test_python_examples_run_as_written(example: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = cut(blocks("python")[example], ("UPDATES = 300", "UPDATES = 30"))
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"__name__": "__docs__"}
    exec(compile(code, f"{PAGE}:example{example + 1}", "exec"), scope)
    out = tmp_path / "runs" / ("torch-net" if example == 0 else "nnx-net")
    assert scope["result"].updates_done == 30
    learned(out)
    assert (out / "checkpoints").is_dir()


def test_gpt_on_tokenized_shards_runs_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")  # the page tokenizes the repository's docs
    (tmp_path / "gpt_shards.toml").write_text(cut(blocks("toml")[0], ("max_updates = 300", "max_updates = 12"),
                                                  ("eval_every = 100", "eval_every = 6"),
                                                  ("warmup_steps = 20", "warmup_steps = 2"),
                                                  ("total_steps = 300", "total_steps = 12")))
    script = blocks("sh")[0].replace("twinstep ", f"{sys.executable} -m conformance ")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = run_process(["bash", "-e", "-c", script], "run the documented commands", PROCESS_S, cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == ["tokenizer.json", "train_000000.bin", "val_000000.bin"]
    learned(tmp_path / "runs" / "gpt-shards")
