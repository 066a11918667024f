"""kind = "train": a whole training config in the file; the run's parameters and per-update metrics.

    [model] [data] [loss] [optimizer] [schedule] [clip] [accumulation] [precision] [checkpoint] [run]
                        a complete training config (absent sections take their defaults)
    [expected]  final_params = { weight = [[...]], bias = [...] }   # after the last update
                loss = [...]          # window loss of every update (inf where run.inject_nonfinite)
                lr = [[...], ...]     # optional: lr applied by every update, one per param group
                skipped = [...]       # optional: whether each update was skipped
                loss_scale = [...]    # optional: the scale in force at each update (dynamic scaling)

At least one of final_params and loss is required (docs/contract.md §3). The backend's
`trainer.train(config, out_dir, progress="none")` runs the config in a temporary directory;
`final_params` come from its TrainResult, the per-update series from the metrics.jsonl it wrote
(the file format of docs/contract.md §5), so every backend is judged by the same outputs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from conformance.harness.arrays import Array, CaseTable, ParamSet
from conformance.harness.backends import Backend
from conformance.harness.case import Case
from conformance.run.metrics import read_metrics, updates

REQUIRED_SECTIONS: tuple[str, ...] = ()
SERIES = ("loss", "lr", "skipped", "loss_scale")


class Inputs(CaseTable):
    """A train case has no inputs: the config is the input."""


class Expected(CaseTable):
    final_params: ParamSet | None = None
    loss: Array | None = None
    lr: Array | None = None
    skipped: Array | None = None
    loss_scale: Array | None = None


def check_case(case: Case) -> None:
    exp = case.expected
    if exp.final_params is None and exp.loss is None:
        raise ValueError("[expected] needs final_params and/or loss")
    from conformance.data import planned_updates

    n = planned_updates(case.config)
    for key in SERIES:
        value = getattr(exp, key)
        if value is not None and len(value) != n:
            raise ValueError(f"expected.{key} has {len(value)} entries; the run makes {n} updates")


def run(case: Case, backend: Backend) -> dict[str, Any]:
    train = backend.function("trainer", "train")
    want = {} if case.expects_error else expected_values(case)
    with tempfile.TemporaryDirectory(prefix="twinstep-case-") as tmp:
        result = train(case.config, Path(tmp) / "run", progress="none")
        records = updates(read_metrics(Path(tmp) / "run" / "metrics.jsonl"))
    got: dict[str, Any] = {}
    if "final_params" in want:
        got["final_params"] = {k: np.asarray(v, np.float64) for k, v in result.params.items()}
    for key in SERIES:
        if key in want:
            got[key] = _series(records, key)
    return got


def _series(records: list[dict[str, Any]], key: str) -> np.ndarray:
    values = [r[key] for r in records]
    if key == "loss_scale":
        return np.asarray([np.nan if v is None else v for v in values], np.float64)
    if key == "skipped":
        return np.asarray(values, bool)
    return np.asarray(values, np.float64)


def expected_values(case: Case) -> dict[str, Any]:
    exp = case.expected
    out: dict[str, Any] = {}
    if exp.final_params is not None:
        out["final_params"] = {k: np.asarray(v, np.float64) for k, v in exp.final_params.items()}
    for key in SERIES:
        value = getattr(exp, key)
        if value is not None:
            out[key] = value.astype(bool) if key == "skipped" else np.asarray(value, np.float64)
    return out
