"""metrics.jsonl lines (conformance/run/metrics.py): the fast strict encoder writes exactly the line the
NaN/inf-spelling encoder writes, for finite and non-finite records alike."""

from __future__ import annotations

import json
import math

import pytest

from conformance.run.metrics import _clean, _dumps

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
