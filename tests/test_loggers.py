"""[run] loggers (conformance/run/loggers.py) against the real packages, offline: W&B in offline mode
and MLflow with its local SQLite store hold the same loss series as metrics.jsonl (exactly), the
evaluations and, as parameters, the resolved config; a resumed run continues the same tracked runs
with no update twice; a tracker that fails never stops training (one warning line, metrics.jsonl
complete); a missing package or a logger named twice is one line before training. Each check has a
control (a changed series, a tracker told to fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.wandb_offline import history

from conformance.cli import main
from conformance.errors import ConfigError
from conformance.config import load_config
from conformance.run import loggers

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)


def _train(out: Path, updates: int, *extra: str) -> int:
    return main(["train", "--backend", "torch", "--out", str(out), "--progress", "none", "--set",
                 'run.loggers=["wandb", "mlflow"]', "--set", f"run.max_updates={updates}", "--set", "run.eval_every=5",
                 *extra])


def _metrics(out: Path) -> tuple[dict[int, float], dict[int, float]]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return ({r["update"]: r["loss"] for r in lines if r["event"] == "update"},
            {r["update"]: r["val_loss"] for r in lines if r["event"] == "eval"})


def _mlflow(out: Path, key: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    ids = json.loads((out / "loggers.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{(out / 'mlflow.db').resolve()}")
    steps = [m.step for m in client.get_metric_history(ids["mlflow"], key)]
    assert len(steps) == len(set(steps)), f"{key}: a step logged twice"
    return {m.step: m.value for m in client.get_metric_history(ids["mlflow"], key)}


def test_trackers_hold_the_metrics_series_and_the_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert _train(out, 12) == 0
    assert "logger failed" not in capsys.readouterr().err  # (a tracker's failure would explain a gap below)
    loss, val = _metrics(out)
    ids = json.loads((out / "loggers.json").read_text())
    sent = history(out, ids["wandb"])
    assert {u: row["train/loss"] for u, row in sent.items()} == loss
    assert {u: row["eval/val_loss"] for u, row in sent.items() if "eval/val_loss" in row} == val
    assert _mlflow(out, "train/loss") == loss and _mlflow(out, "eval/val_loss") == val
    from mlflow.tracking import MlflowClient

    params = MlflowClient(tracking_uri=f"sqlite:///{(out / 'mlflow.db').resolve()}").get_run(ids["mlflow"]).data.params
    assert params["optimizer.name"] == "adamw" and params["run.max_updates"] == "12"
    loss[3] += 1e-9  # control: a changed value is seen
    assert {u: row["train/loss"] for u, row in sent.items()} != loss


def test_a_resumed_run_continues_the_same_tracked_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _train(out, 10) == 0
    ids = json.loads((out / "loggers.json").read_text())
    assert _train(out, 20, "--resume") == 0
    assert json.loads((out / "loggers.json").read_text()) == ids  # the same W&B and MLflow runs
    loss, _ = _metrics(out)
    assert sorted(loss) == list(range(20))
    assert {u: row["train/loss"] for u, row in history(out, ids["wandb"]).items()} == loss  # no step twice
    assert _mlflow(out, "train/loss") == loss


def test_a_failing_tracker_never_stops_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    def broken(self, batch):  # noqa: ANN001
        raise OSError("disk full")

    monkeypatch.setattr(loggers._WandB, "send", broken)
    out = tmp_path / "run"
    assert _train(out, 12) == 0
    err = capsys.readouterr().err
    assert err.count("the wandb logger failed (OSError: disk full); it is off for the rest of this run") == 1
    assert "mlflow logger" not in err, err
    loss, _ = _metrics(out)
    assert sorted(loss) == list(range(12))
    assert _mlflow(out, "train/loss") == loss  # the other tracker carried on
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nope://nowhere")  # one that cannot start: the same
    assert _train(tmp_path / "again", 3) == 0
    assert "the mlflow logger could not start" in capsys.readouterr().err


def test_a_missing_package_or_a_logger_named_twice_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)
    assert _train(tmp_path / "run", 3) == 2
    assert capsys.readouterr().err.strip() == ("twinstep: error: run.loggers: the wandb logger needs the wandb package: "
                                               "pip install 'twinstep[wandb]'")
    with pytest.raises(ConfigError, match=r"run.loggers names a logger twice: \['mlflow', 'mlflow'\]"):
        load_config({"run": {"loggers": ["mlflow", "mlflow"]}})
