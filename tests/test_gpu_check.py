"""bench/gpu_check.sh cannot rot: its smoke mode runs every step of the GPU check on the CPU at tiny
sizes (the same scripts, modules and configs), so a moved module, a renamed option or a config the
trainer refuses fails here rather than on a lent GPU. Negative control: a step that fails makes the
script fail and names the step.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from support.processes import child_env

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10


def smoke(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**child_env(), "OUT": str(out), **env})


def test_every_step_of_the_gpu_check_runs_in_its_smoke_mode(tmp_path: Path) -> None:
    done = smoke(tmp_path)
    report = (tmp_path / "gpu_check.txt").read_text()
    assert done.returncode == 0, report[-4000:]
    finished = re.findall(r"^-- (\d+) .*: exit (\d+) in \d+s$", report, re.MULTILINE)
    assert [int(n) for n, _ in finished] == list(range(1, STEPS + 1)), report[-4000:]
    assert all(rc == "0" for _, rc in finished)
    assert "every step passed" in report
    # each step did its work, not only exited 0
    for line in ("trained 4 updates", "gpt2_compiled: median", "trainer / minimal", "gpu_jax: step twinstep"):
        assert line in report, line


def test_negative_control_a_failing_step_fails_the_check(tmp_path: Path) -> None:
    done = smoke(tmp_path, PYTHON="false")  # every Python step exits 1 at once
    report = (tmp_path / "gpu_check.txt").read_text()
    assert done.returncode == 1
    assert re.search(r"^gpu_check: \d+ step\(s\) failed: .*2 CUDA tests", report, re.MULTILINE), report[-2000:]
    assert os.path.isdir(tmp_path / "runs")
