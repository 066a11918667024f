"""`twinstep compare DIR_A DIR_B`: per-update differences, the first update beyond tolerance, exit
status, plot; and negative controls with real runs: a JAX run with an off-by-one schedule or a
different clip eps must fail against the torch reference, while the faithful JAX run passes.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from support.processes import PROCESS_S, run_process

from conformance.cli import main
from conformance.config import dump_config, load_config
from conformance.rules.tolerance import Tolerance, default_tolerance
from conformance.run.compare import close, compare_runs

ROOT = Path(__file__).resolve().parents[1]


def line(u: int, loss: float, **kw: Any) -> dict[str, Any]:
    rec = {"event": "update", "update": u, "epoch": 0, "samples_seen": 8 * (u + 1), "loss": loss, "lr": [0.1],
           "grad_norm": 1.0 + u, "loss_scale": None, "skipped": False, "data_time_s": 0.0,
           "compute_time_s": 0.01, "samples_per_s": 800.0}
    rec.update(kw)
    return rec


def write_run(path: Path, records: list[dict[str, Any]], dtype: str = "float64", **config: Any) -> Path:
    path.mkdir(parents=True)
    cfg = load_config({"precision": {"dtype": dtype}, **config})
    (path / "config.toml").write_text(dump_config(cfg))

    def clean(v: Any) -> Any:
        return ("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v) else v

    text = "".join(json.dumps({k: clean(v) for k, v in r.items()}) + "\n" for r in records)
    (path / "metrics.jsonl").write_text(text)
    return path


def base(n: int = 6) -> list[dict[str, Any]]:
    out = [line(u, 1.0 / (u + 1)) for u in range(n)]
    out.insert(3, {"event": "eval", "update": 2, "val_loss": 0.4, "val_accuracy": 0.75})
    return out


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    rc = main(["compare", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_equal_runs_pass_and_print_every_update(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_run(tmp_path / "a", base()), write_run(tmp_path / "b", base())
    rc, out, _ = run_cli(capsys, str(a), str(b))
    assert rc == 0 and "PASS" in out and len(out.splitlines()) == 3  # by default the summary only
    assert "worst: update 0 (0% of the tolerance)" in out
    rc, out, _ = run_cli(capsys, str(a), str(b), "--all")
    assert rc == 0 and "PASS" in out
    rows = [ln for ln in out.splitlines() if ln.strip() and ln.split()[0].isdigit() and "compared" not in ln]
    assert [int(r.split()[0]) for r in rows] == list(range(6))
    assert "eval" in out and "6 updates, 1 evaluations compared" in out


def test_first_update_beyond_tolerance_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recs = base()
    recs[4] = line(3, 0.25 * (1 + 1e-9))  # 1e-9 relative: beyond float64's 1e-10
    recs[6] = line(5, 1 / 6 * (1 + 1e-3))
    a, b = write_run(tmp_path / "a", base()), write_run(tmp_path / "b", recs)
    rc, out, _ = run_cli(capsys, str(a), str(b), "--quiet")
    assert rc == 1
    assert "FAIL: first beyond rtol 1e-10, atol 1e-12 at update 3: loss 0.25 vs 0.25000000025 (rel 1.00e-09)" in out
    assert len(out.splitlines()) == 3  # --quiet: the summary only
    assert "worst: update 5 (9.43e+08% of the tolerance)" in out  # not the first failure: the largest
    rc, out, _ = run_cli(capsys, str(a), str(b), "--rtol", "1e-2", "--quiet")
    assert rc == 0 and "PASS: every value within rtol 0.01, atol 0" in out


@pytest.mark.parametrize(("field", "value"), [("skipped", True), ("loss_scale", 1024.0), ("samples_seen", 7),
                                              ("lr", [0.1000001]), ("grad_norm", None)])
def test_each_field_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture, field: str, value: Any) -> None:
    recs = base()
    recs[2] = line(2, 1 / 3, **{field: value})
    a, b = write_run(tmp_path / "a", base()), write_run(tmp_path / "b", recs)
    rc, out, _ = run_cli(capsys, str(a), str(b), "--quiet")
    assert rc == 1 and f"at update 2: {field} " in out


def test_matching_overflows_pass_and_a_lone_one_fails(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    skip = line(2, math.inf, grad_norm=None, skipped=True)
    recs = base()
    recs[2] = skip
    a, b = write_run(tmp_path / "a", recs), write_run(tmp_path / "b", recs)
    assert run_cli(capsys, str(a), str(b))[0] == 0
    c = write_run(tmp_path / "c", base())
    rc, out, _ = run_cli(capsys, str(a), str(c), "--quiet")
    assert rc == 1 and "at update 2: loss inf vs 0.3333333333" in out


def test_missing_updates_and_config_differences_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = write_run(tmp_path / "a", base())
    b = write_run(tmp_path / "b", [r for r in base() if r.get("update") != 3], optimizer={"lr": 0.5})
    rc, out, _ = run_cli(capsys, str(a), str(b), "--quiet")
    assert rc == 1
    assert "problem: run B has no line for update 3" in out  # a hole inside B's range
    assert "note: configs differ: optimizer.lr = 0.001 in A, 0.5 in B" in out


def test_a_shorter_run_is_compared_over_the_updates_both_have(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = write_run(tmp_path / "a", base())
    b = write_run(tmp_path / "b", [r for r in base() if r.get("update", 0) < 4])
    rc, out, _ = run_cli(capsys, str(a), str(b))
    assert rc == 0 and "note: run B ends after update 3: compared the 4 updates both runs have (2 more in run A)" in out
    assert "4 updates" in out and "PASS" in out
    rc, out, _ = run_cli(capsys, str(b), str(a))  # either side may be the shorter
    assert rc == 0 and "note: run A ends after update 3" in out
    recs = [r for r in base() if r.get("update", 0) < 4]
    recs[1] = line(1, 0.5 * (1 + 1e-6))  # control: a difference inside the shared updates still fails
    rc, out, _ = run_cli(capsys, str(a), str(write_run(tmp_path / "c", recs)))
    assert rc == 1 and "FAIL: first beyond" in out and "at update 1" in out
    strict = compare_runs(a, b)  # the API's default (the trainers' tests): a missing update is a problem
    assert not strict.passed and strict.problems == ["run B has no line for update 4 (2 updates of A are missing in B)"]


def test_default_tolerance_follows_the_dtype(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", base(), dtype="float32")
    b = write_run(tmp_path / "b", base(), dtype="float64")
    assert compare_runs(a, b).tolerance == default_tolerance("float32", "run")  # the looser of the two
    assert close(1.0, 1.0 + 1e-4, Tolerance(0.0, 2e-4))[0] and not close(1.0, 1.0 + 3e-4, Tolerance(0.0, 2e-4))[0]
    assert close(None, None, Tolerance(0, 0))[0] and not close(math.nan, math.inf, Tolerance(1, 1))[0]


def test_plot_is_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a, b = write_run(tmp_path / "a", base()), write_run(tmp_path / "b", base())
    rc, out, _ = run_cli(capsys, str(a), str(b), "--quiet", "--plot", str(tmp_path / "p" / "curves.png"))
    assert rc == 0 and (tmp_path / "p" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", base())
    for args in ([str(a), str(tmp_path / "missing")], [str(a), str(a), "--rtol", "-1"]):
        proc = run_process([sys.executable, "-m", "conformance", "compare", *args], "refuse the input", PROCESS_S,
                           capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2 and proc.stderr.startswith("twinstep: error: ")
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "missing: no such run directory" in run_process(
        [sys.executable, "-m", "conformance", "compare", str(a), str(tmp_path / "missing")], "refuse the input",
        PROCESS_S, capture_output=True, text=True, cwd=ROOT).stderr


# ---------------------------------------------------------------------------------------------
# negative controls on real runs (float64: the faithful mirror agrees to ~1e-16)
# ---------------------------------------------------------------------------------------------

REAL = {"model": {"name": "linear"}, "data": {"name": "linear_regression", "batch_size": 16}, "loss": {"name": "mse"},
        "optimizer": {"name": "sgd", "lr": 0.2, "momentum": 0.9}, "schedule": {"name": "cosine", "t_max": 12},
        "clip": {"max_norm": 1.0}, "precision": {"dtype": "float64"},
        "run": {"max_updates": 12, "progress": "none", "device": "cpu"}}


@pytest.fixture(scope="module")
def torch_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ref_torch.trainer import train

    out = tmp_path_factory.mktemp("reference") / "torch"
    train(load_config(REAL), out)
    return out


def _jax(out: Path, monkeypatch: pytest.MonkeyPatch | None = None, **overrides: Any) -> Path:
    from ref_jax.trainer import train

    train(load_config({**REAL, **overrides}), out)
    return out


def test_faithful_jax_run_passes(torch_reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    b = _jax(tmp_path / "jax")
    rc, out, _ = run_cli(capsys, str(torch_reference), str(b), "--quiet")
    assert rc == 0, out


def test_off_by_one_schedule_fails(torch_reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    from ref_jax import _train_state as ts

    real = ts.schedule_tables

    def shifted(config: Any, per_epoch: int, planned: int) -> Any:
        tables = real(config, per_epoch, planned + 1)
        return {k: v[1:] for k, v in tables.items()}  # update t applies the value of t + 1

    monkeypatch.setattr(ts, "schedule_tables", shifted)
    b = _jax(tmp_path / "jax")
    rc, out, _ = run_cli(capsys, str(torch_reference), str(b), "--quiet")
    assert rc == 1 and "at update 0: lr [0.2] vs [0.1965925826" in out


def test_different_clip_eps_fails(torch_reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    b = _jax(tmp_path / "jax", clip={"max_norm": 1.0, "eps": 0.0})  # optax's rule instead of torch's 1e-6
    rc, out, _ = run_cli(capsys, str(torch_reference), str(b), "--quiet")
    assert rc == 1 and "note: configs differ: clip.eps = 1e-06 in A, 0.0 in B" in out
    assert "FAIL: first beyond rtol 1e-10, atol 1e-12 at update 1: loss" in out  # update 0 clips; 1 shows it
