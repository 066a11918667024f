"""A trainer's framework steps for conformance.run.loop.drive (its Steps protocol): the model,
optimizer, schedule and loss scale built and restored, one update over a window, an evaluation,
a checkpoint, the final weights. The run's decisions (when to evaluate, save, stop; the best
validation loss; metrics lines) are the driver's, written once for both trainers.
"""

from __future__ import annotations

import functools
import random
import resource
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from conformance.config import Config
from conformance.config.optimizer import SCHEDULE_FREE
from conformance.events import notify
from conformance.rules.ema import ema_due
from conformance.rules.schedules import check_observed, check_run_length
from conformance.run.batches import injected, window_counts
from conformance.run.loop import Update
from conformance.run.records import EvalTotals, add_eval
from conformance.run.session import Run
from ref_jax import _train_state as ts
from ref_jax._parallel import gather_bytes, placement
from ref_jax._train_step import StepOutput, make_eval_step, make_train_step
from ref_jax._update import UpdateSpecs, finish_update
from ref_jax._window import batch_fields, pad_rows
from ref_jax.ema import update_ema


class Steps:
    """The framework steps of a run (conformance.run.loop.Steps): model, optimizer, schedule
    and loss scale built, then restored from run.checkpoint when resuming."""

    def __init__(self, run: Run, model: Any, loss_fn: Callable[[Any, Any], Any] | None) -> None:
        config = self.config = run.config
        self.run, self.loss_fn = run, loss_fn
        random.seed(config.run.seed)  # the host generators, seeded as the torch trainer seeds them
        np.random.seed(config.run.seed % 2**32)
        place = self.place = placement(config.run.device)
        parts = self.parts = ts.build(config, run.data.info, place, run.data.updates_per_epoch, run.planned, model)
        self.state, self.key = ts.initial_state(parts, run, place)
        self.average = ts.initial_ema(config, parts.params, run, place)
        self.ema_step = jax.jit(lambda a, p, due: update_ema(config.ema, a, p, due), donate_argnums=(0,))
        self.step = make_train_step(config, parts.apply, parts.policy, parts.tx, parts.layout, place, loss_fn)
        check_observed(config.schedule, config.run.eval_every, run.data.info.n_val, config.loss.name)
        self.plateau = ts.plateau_start(config, run)  # reduce_on_plateau: its lrs replace the tables
        self.tables = place.put_replicated(parts.tables if self.plateau is None else
                                           ts.plateau_tables(parts, self.plateau))
        self.evaluator: Any = None
        self.specs = UpdateSpecs(config.accumulation, config.clip, config.precision)
        self.device_name = place.devices[0].device_kind if place.devices[0].platform != "cpu" else None
        per_epoch = run.data.updates_per_epoch if config.schedule.unit == "epoch" else 1
        for note in check_run_length(config.schedule, run.planned, per_epoch):
            if run.metrics is not None:
                run.metrics.note(note)
        self.prepared = _prepare(run, parts, place, run.start, loss_fn is not None) if run.start < run.planned \
            else None
        # schedule-free: the state holds x between updates, y = lerp(x, z, 1 − β) only inside one
        self.free = config.optimizer.name in SCHEDULE_FREE
        self.to_y, self.to_x = (jax.jit(functools.partial(ts.at_point, train=b), donate_argnums=(0,))
                                for b in (True, False))

    def update(self, t: int) -> Update:
        """Run update t over run.data.window(t) (raising NonFiniteError under the policy)."""
        config, run, free = self.config, self.run, self.free
        window, arrays, data_s = self.prepared
        t0 = time.perf_counter()
        state, out = self.step(self.to_y(self.state) if free else self.state, arrays, np.int32(t), self.tables,
                               self.key)
        if self.average is not None:  # on the device, after the step: due unless the update was skipped
            self.average = self.ema_step(self.average, state.update.params,
                                         ema_due(config.ema, t) & ~out.info.skipped)
        self.state = state = self.to_x(state) if free else state
        notify(run.events, "dispatched", update=t)
        # build the next window on the host while the device computes this one
        self.prepared = _prepare(run, self.parts, self.place, t + 1, self.loss_fn is not None) \
            if t + 1 < run.planned else None
        overlap = self.prepared[2] if self.prepared is not None else 0.0
        out = jax.device_get(out)  # the update's one wait for the device: every metric in one transfer
        info = finish_update(self.specs, state.update, out.info, update=t)
        return Update(window, info._asdict(), _lrs(out), data_s, max(time.perf_counter() - t0 - overlap, 0.0))

    def evaluate(self, t: int) -> EvalTotals:
        """Validation sums after update t over every rank, with the weights evaluations see."""
        parts, state = self.parts, self.state
        self.evaluator = self.evaluator or make_eval_step(self.config, parts.apply, parts.policy, parts.layout,
                                                          self.place, self.loss_fn)
        weights = _evaluation_params(self.config, state, self.average)
        return _evaluate(self.run, parts, self.place, self.evaluator, weights, state.update.model_state)

    def observe(self, record: Mapping[str, Any]) -> None:
        """An evaluation's record, for a schedule that watches it (reduce_on_plateau)."""
        if self.plateau is not None:
            self.plateau = ts.plateau_observe(self.config, self.plateau, record[self.config.schedule.monitor])
            self.tables = self.place.put_replicated(ts.plateau_tables(self.parts, self.plateau))

    def save(self, updates_done: int, val_loss: float | None) -> Path | None:
        """Checkpoint the state after `updates_done` updates; collective (rank 0's path, else None)."""
        return ts.save_checkpoint(self.run, self.place, self.state, self.key, updates_done, val_loss, self.plateau,
                                  self.average)

    def peak_memory_bytes(self) -> int:
        """The accelerator's peak bytes in use so far (the CPU: the process's peak RSS)."""
        return _peak_memory(jax.local_devices()[0])

    def final_params(self) -> dict[str, Any]:
        """The training weights as NumPy arrays by neutral name, once the last update is done."""
        state = self.to_y(self.state) if self.free else self.state  # the training weights (schedule-free: y)
        self.state = state
        self.parts.write_back(state.update.params, state.update.model_state or {})  # a user's NNX module holds it
        return ts.params_numpy(state)


def _peak_memory(device: Any) -> int:
    """The accelerator's peak bytes in use (its allocator's statistics), else the process's peak RSS."""
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def _lrs(out: StepOutput) -> list[float]:
    return [float(x) for x in np.asarray(out.lrs, np.float64)]


def _prepare(run: Run, parts: ts.Parts, place: Any, t: int, user_loss: bool) -> tuple[Any, dict[str, Any], float]:
    """Update t's window: the host batches, padded to the fixed shape and placed on the mesh (a
    loss_fn's counts come with its sums: no divisor is laid out)."""
    t0 = time.perf_counter()
    window = run.data.window(t)
    counts = None if user_loss else window_counts(run.config, window)
    if counts is not None and run.world_size > 1:  # the divisor is the global micro-batches' count
        parts_ = [np.frombuffer(b, np.float64) for b in gather_bytes(np.asarray(counts, np.float64).tobytes())]
        counts = list(np.sum(parts_, axis=0))
    arrays = parts.layout.pad(window, counts, injected(run.config, t))
    placed = place.put_batch(arrays, axis=1)
    return window, placed, time.perf_counter() - t0


def _evaluation_params(config: Config, state: Any, average: Any) -> Any:
    """The EMA's weights with [ema] evaluate (once started), else the parameters as they are between
    updates (a schedule-free optimizer's x)."""
    if _evaluates_ema(config, average):
        return {n: w.astype(state.update.params[n].dtype) for n, w in average.weights.items()}
    return state.update.params


def _evaluates_ema(config: Config, average: Any) -> bool:
    """Whether evaluations see the EMA's weights ([ema] evaluate, once it has started)."""
    return bool(config.ema.evaluate and average is not None and bool(average.started))


def _evaluate(run: Run, parts: ts.Parts, place: Any, evaluate: Any, params: Any, model_state: Any) -> EvalTotals:
    """Σ loss sums / Σ counts over every validation sample, and accuracy for classification."""
    total = EvalTotals()
    layout = parts.layout
    for batch in run.data.val_batches():
        arrays = pad_rows(batch_fields(batch), parts.eval_rows, layout.real_dtype)
        sums = jax.device_get(evaluate(params, model_state, place.put_batch(arrays, axis=0)))
        total = add_eval(total, float(sums.loss_sum), float(sums.count), int(sums.correct), int(sums.predictions))
    return total
