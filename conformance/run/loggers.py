"""The experiment trackers a run reports to beside metrics.jsonl: `[run] loggers = ["tensorboard",
"wandb", "mlflow"]` (`run.tensorboard = true` is "tensorboard").

Each gets the scalars of metrics.jsonl (`train/loss`, `train/lr/group0`, `train/grad_norm`, ...,
`eval/val_loss`, ...) at their update index, and W&B and MLflow the resolved config as the run's
parameters. Where they write is their own packages' settings, as with HF Trainer's `report_to`:
W&B's `WANDB_PROJECT`, `WANDB_MODE` (e.g. `offline`) and `WANDB_DIR` (default: the run directory),
MLflow's `MLFLOW_TRACKING_URI` (default: the SQLite store `DIR/mlflow.db`) and
`MLFLOW_EXPERIMENT_NAME`. A resumed run continues the same tracked run: its ids are kept in
`DIR/loggers.json`, and updates the tracker already holds are not sent again (a resume replays them
bit for bit, so nothing is lost). A tracker that fails never stops training: one warning line, and
that tracker is off for the rest of the run. Scalars are sent in batches when metrics.jsonl is
flushed (about once a second), so a tracker costs no time inside an update.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conformance.errors import TwinstepError, TwinstepWarning
from conformance.files import read_regular, write_text_atomic

LOGGERS = ("tensorboard", "wandb", "mlflow")
IDS_FILE = "loggers.json"  # the tracked runs' ids, for a resume
UPDATE_KEYS = ("loss", "grad_norm", "loss_scale", "samples_per_s", "tokens_per_s", "mfu")

Scalars = dict[str, float]


def update_scalars(rec: Mapping[str, Any]) -> Scalars:
    """The tracked scalars of an update line."""
    out = {f"train/{k}": float(rec[k]) for k in UPDATE_KEYS if isinstance(rec.get(k), (int, float))
           and not isinstance(rec.get(k), bool)}
    for i, lr in enumerate(rec.get("lr") or []):
        out[f"train/lr/group{i}"] = float(lr)
    return out


def eval_scalars(rec: Mapping[str, Any]) -> Scalars:
    """The tracked scalars of an eval line."""
    return {f"eval/{k}": float(v) for k, v in rec.items()
            if k not in ("event", "update") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in data.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


class _TensorBoard:
    """Scalars in TensorBoard event files under DIR/tensorboard, written with the tensorboard
    package's own writer (no framework: a JAX run does not import torch). Each scalar is one Event
    holding a `simple_value` Summary, as torch.utils.tensorboard.SummaryWriter.add_scalar writes it."""

    name = "tensorboard"

    def __init__(self, out: Path, config: Mapping[str, Any], ids: dict[str, str]) -> None:
        try:
            import tensorboard  # noqa: F401  (first: the package itself is what may be missing)
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError:
            raise TwinstepError("run.tensorboard / run.loggers: the tensorboard logger needs the tensorboard package: "
                                "pip install 'twinstep[tensorboard]'") from None
        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(out / "tensorboard"), max_queue_size=10, flush_secs=120)
        self.last_step = -1  # event files append: a resume's replayed updates are written again

    def send(self, batch: list[tuple[int, Scalars]]) -> None:
        for step, values in batch:
            for tag, value in values.items():
                summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)])
                self._writer.add_event(self._event(summary=summary, step=step, wall_time=time.time()))

    def close(self) -> None:
        self._writer.close()


class _WandB:
    """Weights & Biases: one run per twinstep run (its id in loggers.json), resumed with resume="allow"."""

    name = "wandb"

    def __init__(self, out: Path, config: Mapping[str, Any], ids: dict[str, str]) -> None:
        try:
            import wandb
        except ImportError:
            raise TwinstepError("run.loggers: the wandb logger needs the wandb package: pip install 'twinstep[wandb]'"
                                ) from None
        run_id = ids.get("wandb") or uuid.uuid4().hex[:8]  # W&B's own ids are 8 characters of [a-z0-9]
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "twinstep"), id=run_id, resume="allow",
                               dir=os.environ.get("WANDB_DIR", str(out)), config=dict(config), name=out.name,
                               settings=wandb.Settings(console="off", silent=True))
        ids["wandb"] = run_id
        self.last_step = int(self._run.step) - 1  # W&B's next step: the updates it holds are below it

    def send(self, batch: list[tuple[int, Scalars]]) -> None:
        for step, values in batch:
            self._run.log(values, step=step)

    def close(self) -> None:
        self._run.finish()


class _MLflow:
    """MLflow: one run per twinstep run (its id in loggers.json), the config as its parameters."""

    name = "mlflow"

    def __init__(self, out: Path, config: Mapping[str, Any], ids: dict[str, str]) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TwinstepError("run.loggers: the mlflow logger needs the mlflow package: pip install 'twinstep[mlflow]'"
                                ) from None
        for noisy in ("mlflow", "alembic"):  # their INFO lines (creating tables, migrations) are not ours to show
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # MLflow 3 keeps its file store read-only ("maintenance mode"): a local SQLite store instead
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(out / 'mlflow.db').resolve()}"
        self._client, self._metric = MlflowClient(tracking_uri=uri), Metric
        self._id = ids.get("mlflow")
        if self._id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "twinstep")
            found = self._client.get_experiment_by_name(name)
            experiment = found.experiment_id if found else self._client.create_experiment(name)
            self._id = self._client.create_run(experiment, run_name=out.name).info.run_id
            params = [Param(k, v[:6000]) for k, v in _flat(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
                self._client.log_batch(self._id, params=params[i:i + 100])
        ids["mlflow"] = self._id
        history = self._client.get_metric_history(self._id, "train/loss")
        self.last_step = max((m.step for m in history), default=-1)

    def send(self, batch: list[tuple[int, Scalars]]) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(k, v, now, step) for step, values in batch for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
            self._client.log_batch(self._id, metrics=metrics[i:i + 1000])

    def close(self) -> None:
        self._client.set_terminated(self._id)


_MAKERS: dict[str, Callable[..., Any]] = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}


class Loggers:
    """The run's trackers (see the module docstring): `add(step, scalars)` queues, `flush()` sends."""

    def __init__(self, out: Path, names: list[str], config: Mapping[str, Any]) -> None:
        self._out = out
        ids = self._read_ids()
        self._live = []
        for name in names:
            try:
                self._live.append(_MAKERS[name](out, config, ids))
            except TwinstepError:
                raise  # a missing package: one error line before training starts
            except Exception as exc:  # the tracker itself failed to start: train without it
                _warn(name, exc, "could not start")
        if any(n in ids for n in ("wandb", "mlflow")):
            write_text_atomic(out / IDS_FILE, json.dumps(ids, indent=1) + "\n")
        self._queue: list[tuple[int, Scalars]] = []

    def _read_ids(self) -> dict[str, str]:
        path = self._out / IDS_FILE
        if not path.exists():
            return {}
        try:
            data = json.loads(read_regular(path, 1 << 16, what="loggers.json").decode("utf-8"))
            return {k: str(v) for k, v in data.items() if k in LOGGERS}
        except (TwinstepError, ValueError, AttributeError) as exc:
            warnings.warn(f"{path} unreadable ({exc}); the trackers start new runs", TwinstepWarning, stacklevel=2)
            return {}

    def add(self, step: int, values: Scalars) -> None:
        if self._live and values:
            self._queue.append((step, {k: v for k, v in values.items() if not math.isnan(v)}))

    def flush(self) -> None:
        batch, self._queue = self._queue, []
        for logger in list(self._live):
            mine = [(s, v) for s, v in batch if s > logger.last_step]
            if mine:
                self._guard(logger, lambda lg=logger, b=mine: lg.send(b))

    def close(self) -> None:
        self.flush()
        for logger in list(self._live):
            self._guard(logger, logger.close)
        self._live = []

    def _guard(self, logger: Any, call: Callable[[], Any]) -> None:
        try:
            call()
        except Exception as exc:  # a tracker's failure (network, disk, its own bug) never stops training
            self._live.remove(logger)
            _warn(logger.name, exc, "failed")
            if call != logger.close:
                try:
                    logger.close()  # release what it holds (W&B's run, MLflow's connection), best effort
                except Exception:  # noqa: S110 - already reported above
                    pass


def _warn(name: str, exc: Exception, what: str) -> None:
    text = " ".join(str(exc).split())[:300]
    warnings.warn(f"the {name} logger {what} ({type(exc).__name__}: {text}); it is off for the rest of this run, "
                  f"training goes on", TwinstepWarning, stacklevel=3)
