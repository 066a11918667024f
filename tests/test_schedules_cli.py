"""`twinstep schedule CONFIG` and `twinstep plot schedule CONFIG -o lr.png`."""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib.figure
import numpy as np
import pytest

from conformance import data
from conformance.cli import main
from conformance.cli import plot as plot_cli
from conformance.cli import schedule as schedule_cli
from conformance.config import load_config

CONFIG = """
[optimizer]
name = "adamw"
lr = 3e-4
[[optimizer.groups]]
params = ["head.*"]
lr = 1e-3
[schedule]
name = "warmup_cosine"
warmup_steps = 20
total_steps = 100
eta_min = 1e-5
[run]
max_updates = 120
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    return path


def test_schedule_table(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert "schedule: warmup_cosine" in out and "120 updates from the planned run" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("groups[0]", "default"))}
    # base lr, first, peak, at update, last: the peak comes at update warmup_steps (= 20)
    assert rows["groups[0]"][1:5] == ["0.001", "0", "0.001", "20"]
    assert rows["default"][1:5] == ["0.0003", "0", "0.0003", "20"]
    assert float(rows["default"][5]) == pytest.approx(1e-5)  # held at eta_min after update 100
    assert "update      20  warm-up ends: peak lr" in out
    assert "update     100  eta_min reached and held" in out
    assert "max |lr - torch lr|: jax" in out and "oracle" in out


def test_schedule_steps_override_and_notes(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", str(config_file), "--steps", "10", "--backend", "oracle"]) == 0
    out = capsys.readouterr().out
    assert "10 updates from --steps" in out
    assert "note: schedule.warmup_steps = 20 is longer than the run (10 updates)" in out


def test_schedule_run_too_short_is_an_error(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", str(config_file), "--set", "run.max_updates=15"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinstep: error: schedule.warmup_steps = 20 is longer than the run") and err.count("\n") == 1


def test_schedule_epoch_unit_needs_updates_per_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "e.toml"
    path.write_text('[schedule]\nname = "step"\nunit = "epoch"\nstep_size = 2\n[run]\nmax_updates = 12\n')
    assert main(["schedule", str(path), "--updates-per-epoch", "3", "--backend", "oracle"]) == 0
    out = capsys.readouterr().out
    assert "3 updates per epoch" in out and "update       6  x gamma = 0.1" in out


def test_planned_updates_prefers_run_max_updates() -> None:
    config = load_config({"run": {"max_updates": 77}})
    assert data.planned_updates(config) == 77


def test_plot_schedule_writes_png_with_both_backends(config_file: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    labels: list[str] = []
    real_savefig = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        for ax in fig.axes:
            labels.extend(line.get_label() for line in ax.get_lines())
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    out = tmp_path / "lr.png"
    assert main(["plot", "schedule", str(config_file), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert {"groups[0] (torch)", "groups[0] (jax)", "default (torch)", "default (jax)"} <= set(labels)


def test_plot_onecycle_draws_momentum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[str] = []
    real_savefig = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (drawn.extend(ax.get_ylabel() for ax in fig.axes), real_savefig(fig, *a, **k)))
    out = tmp_path / "cycle.png"
    args = ["plot", "schedule", "--set", "schedule.name=onecycle", "--set", "schedule.total_steps=50",
            "--set", "optimizer.name=sgd", "--steps", "50", "-o", str(out)]
    assert main(args) == 0
    assert drawn == ["learning rate", "momentum"]


def test_plot_metrics_of_a_missing_run_is_a_one_line_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", "metrics", str(tmp_path / "no-run"), "-o", str(tmp_path / "m.png")]) == 2
    err = capsys.readouterr().err
    assert "no-run" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.png").exists()


def test_plot_registry_takes_kinds_from_cli_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that defines add_plot_parser adds its kind (here: a stand-in for a metrics module)."""
    import types

    fake = types.ModuleType("conformance.cli.fake_metrics")
    fake.add_plot_parser = lambda plots: plots.add_parser("metrics").set_defaults(run=lambda a: 0)  # type: ignore[attr-defined]
    real_import = plot_cli.importlib.import_module
    monkeypatch.setattr(plot_cli.pkgutil, "iter_modules",
                        lambda path: [types.SimpleNamespace(name="schedule"), types.SimpleNamespace(name="fake_metrics")])
    monkeypatch.setattr(plot_cli.importlib, "import_module",
                        lambda name: fake if name.endswith("fake_metrics") else real_import(name))
    parser = argparse.ArgumentParser()
    kinds = plot_cli.register_plots(parser.add_subparsers())
    assert kinds == ["metrics", "schedule"]


def test_key_points_of_sequential() -> None:
    spec = load_config({"schedule": {"name": "sequential", "milestones": [5], "schedulers": [
        {"name": "warmup_cosine", "warmup_steps": 2, "total_steps": 10}, {"name": "step", "step_size": 3}]}}).schedule
    assert schedule_cli.key_points(spec)[:4] == [
        (2, "part 0: warm-up ends: peak lr"), (5, "milestone: part 1 (step) starts"),
        (8, "part 1: x gamma = 0.1"), (11, "part 1: x gamma = 0.1")]
    assert np.all(np.diff([p for p, _ in schedule_cli.key_points(spec)]) > 0)



def test_key_points_of_a_table_name_where_it_ends() -> None:
    spec = load_config({"schedule": {"name": "tabulated", "factors": [0.1, 1.0, 0.5, 0.25]}}).schedule
    assert schedule_cli.key_points(spec) == [(3, "table ends: x 0.25 held")]
    assert schedule_cli.key_points(load_config({"schedule": {"name": "tabulated", "factors": [0.5]}}).schedule) == []
def _write(tmp_path: Path, schedule: str) -> Path:
    path = tmp_path / "peer.toml"
    path.write_text(f'[optimizer]\nname = "sgd"\nlr = 0.1\nmomentum = 0.9\n[schedule]\n{schedule}\n')
    return path


def test_cyclic_shows_its_peaks_and_momentum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, 'name = "cyclic"\nmax_lr = 0.5\nstep_size_up = 3\nstep_size_down = 5\nmode = "triangular2"')
    assert main(["schedule", str(path), "--steps", "30"]) == 0
    out = capsys.readouterr().out
    peaks = [float(line.split()[-1]) for line in out.splitlines() if "cycle peak" in line]
    assert peaks == [0.5, 0.3, 0.2, 0.15]  # triangular2: the amplitude above 0.1 halves every cycle
    assert "momentum cycles: first 0.9, lowest 0.8 at update 3" in out


def test_plateau_replays_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, 'name = "reduce_on_plateau"\npatience = 1')
    metrics = tmp_path / "val.txt"
    metrics.write_text("1.0, 1.0\n1.0 1.0 1.0 1.0\n")
    assert main(["schedule", str(path), "--steps", "6", "--metrics", str(metrics)]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("default"))
    assert float(row[-1]) == pytest.approx(0.001)  # reduced twice: after 3 and after 5 equal values
    assert main(["schedule", str(path), "--steps", "6"]) == 0
    assert "without --metrics every lr holds" in capsys.readouterr().out


@pytest.mark.parametrize(("schedule", "text", "words"), [
    ('name = "cyclic"\nmax_lr = 0.5', "1 2 3", "--metrics is only read by schedule.name = 'reduce_on_plateau'"),
    ('name = "reduce_on_plateau"', "1 2", "2 metrics for 3 updates"),
    ('name = "reduce_on_plateau"', "1 x 2", "'x' is not a number"),
])
def test_bad_metrics_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], schedule: str, text: str,
                                  words: str) -> None:
    metrics = tmp_path / "val.txt"
    metrics.write_text(text)
    assert main(["schedule", str(_write(tmp_path, schedule)), "--steps", "3", "--metrics", str(metrics)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
