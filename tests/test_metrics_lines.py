"""metrics.jsonl lines (conformance/run/metrics.py): the fast strict encoder writes exactly the line the
NaN/inf-spelling encoder writes, for finite and non-finite records alike; update lines are buffered
and reach the file within FLUSH_SECONDS, before any eval line, at every sync and at close."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conformance.run import metrics as metrics_module
from conformance.run.metrics import FLUSH_LINES, FLUSH_SECONDS, MetricsLog, _clean, _dumps, read_metrics

RECORDS = [
    {"event": "update", "update": 3, "loss": 0.1 + 0.2, "lr": [1e-3, 2.5e-4], "loss_scale": None, "skipped": False},
    {"event": "update", "update": 4, "loss": math.nan, "grad_norm": math.inf, "lr": [-math.inf, 1.0]},
    {"event": "eval", "update": 9, "val_loss": 1.25, "nested": {"a": [math.nan, 2]}, "name": "é"},
]


@pytest.mark.parametrize("record", RECORDS, ids=["finite", "non-finite", "nested"])
def test_the_line_is_the_cleaned_json(record: dict) -> None:
    assert _dumps(record) == json.dumps(_clean(record))
    assert "NaN" not in _dumps(record) and "Infinity" not in _dumps(record)


def test_negative_control_plain_json_spells_nan_otherwise() -> None:
    assert json.dumps(RECORDS[1]) != json.dumps(_clean(RECORDS[1]))  # the check can fail


class _Clock:
    """time.monotonic for conformance.run.metrics, advanced by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(path: Path) -> list[tuple[str, int]]:
    return [(r["event"], r["update"]) for r in read_metrics(path)] if path.stat().st_size else []


def _update(u: int) -> dict:
    return {"event": "update", "update": u, "loss": 1.0 / (u + 1), "lr": [0.1]}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(metrics_module.time, "monotonic", c)
    return c


def test_update_lines_reach_the_file_within_flush_seconds(tmp_path: Path, clock: _Clock) -> None:
    log = MetricsLog(tmp_path, 10, progress="none")
    path = tmp_path / "metrics.jsonl"
    log.log_update(_update(0))
    log.log_update(_update(1))
    assert _lines(path) == []  # buffered
    clock.now += FLUSH_SECONDS
    log.log_update(_update(2))  # the first update logged after FLUSH_SECONDS writes all three
    assert _lines(path) == [("update", 0), ("update", 1), ("update", 2)]
    log.log_update(_update(3))
    log.close()  # close writes what is waiting
    assert _lines(path) == [("update", u) for u in range(4)]


def test_eval_and_sync_write_the_waiting_updates_first(tmp_path: Path, clock: _Clock) -> None:
    log = MetricsLog(tmp_path, 10, progress="none")
    path = tmp_path / "metrics.jsonl"
    log.log_update(_update(0))
    log.log_eval({"update": 0, "val_loss": 0.5})
    assert _lines(path) == [("update", 0), ("eval", 0)]
    log.log_update(_update(1))
    log.sync()  # every checkpoint: the file holds every line logged before it
    assert _lines(path) == [("update", 0), ("eval", 0), ("update", 1)]
    log.close()


def test_flush_lines_bounds_the_buffer(tmp_path: Path, clock: _Clock) -> None:
    log = MetricsLog(tmp_path, FLUSH_LINES + 1, progress="none")
    for u in range(FLUSH_LINES):
        log.log_update(_update(u))
    assert len(_lines(tmp_path / "metrics.jsonl")) == FLUSH_LINES  # the FLUSH_LINES-th wrote them, no clock moved
    log.close()


def test_negative_control_an_unflushed_log_shows_nothing(tmp_path: Path, clock: _Clock) -> None:
    # the checks above can fail: without a flush the lines are not in the file yet
    log = MetricsLog(tmp_path, 10, progress="none")
    log.log_update(_update(0))
    assert _lines(tmp_path / "metrics.jsonl") == []
    log.close()
    assert _lines(tmp_path / "metrics.jsonl") == [("update", 0)]


def test_logging_after_close_is_a_path_error(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, 10, progress="none")
    log.close()
    with pytest.raises(metrics_module.PathError, match="the metrics log is closed"):
        log.log_update(_update(0))


def _progress(tmp_path: Path, records: list[dict], log_every: int) -> list[str]:
    import io

    stream = io.StringIO()
    log = MetricsLog(tmp_path, len(records), progress="lines", log_every=log_every, stream=stream)
    for rec in records:
        log.log_update(rec)
    log.close()
    return stream.getvalue().splitlines()


def test_progress_speed_is_the_interval_s_without_the_start_up_update(tmp_path: Path) -> None:
    """Rates 10 (update 0: compiling), then 100, 50, 200 (lines at updates 0, 3 and the last, 5) and
    200, 25: the lines say start-up, then 3/(1/100 + 1/50 + 1/200) = 85.71 (the samples over the
    time of equal windows), then 2/(1/200 + 1/25) = 44.44. Controls: the plain means (117, 112) or
    the start-up update counted (3/(1/10 + ...) = 22.6) would differ."""
    rates = [10.0, 100.0, 50.0, 200.0, 200.0, 25.0]
    records = [{**_update(u), "samples_per_s": r} for u, r in enumerate(rates)]
    lines = _progress(tmp_path, records, log_every=3)
    assert [line.split("grad_norm nan ")[1] for line in lines] == [
        "(start-up, no speed yet)", "86 samples/s", "44 samples/s"]


def test_progress_speaks_tokens_and_mfu_for_language_data(tmp_path: Path) -> None:
    records = [{**_update(u), "samples_per_s": 2.0, "tokens_per_s": t, "mfu": m}
               for u, (t, m) in enumerate([(1.0, 0.01), (3000.0, 0.3), (6000.0, 0.5)])]
    lines = _progress(tmp_path, records, log_every=2)
    assert lines[-1].endswith(" 4000 tokens/s mfu 40.0%") and "samples/s" not in "".join(lines)


@pytest.mark.parametrize("val_loss, want", [(2.0, math.exp(2.0)), (800.0, math.inf), (math.nan, math.nan)])
def test_language_model_evaluations_carry_perplexity(val_loss: float, want: float) -> None:
    from conformance.run.records import EvalTotals, eval_record

    rec = eval_record(4, EvalTotals(loss_sum=val_loss * 8, count=8.0), language_model=True)
    assert rec["val_perplexity"] == want or (math.isnan(want) and math.isnan(rec["val_perplexity"]))
    assert "val_perplexity" not in eval_record(4, EvalTotals(loss_sum=16.0, count=8.0, correct=3, predictions=8))
