"""A trainer's framework steps for conformance.run.loop.drive (its Steps protocol): the model,
optimizer, schedule and loss scale built and restored, one update over a window, an evaluation,
a checkpoint, the final weights. The run's decisions (when to evaluate, save, stop; the best
validation loss; metrics lines) are the driver's, written once for both trainers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from conformance.config import Config
from conformance.errors import UnsupportedError
from conformance.events import notify
from conformance.rules import plateau
from conformance.rules.ema import ema_due
from conformance.rules.inputs import INDEX_LOSSES
from conformance.rules.schedules import check_observed, check_run_length
from conformance.run.batches import injected, window_counts
from conformance.run.loop import Update
from conformance.run.pretrained import initial_weights
from conformance.run.records import EvalTotals
from conformance.run.session import Run
from ref_torch import _fsdp, _model, _sync_bn, _train_state
from ref_torch import _parallel as ddp
from ref_torch import _runtime as rt
from ref_torch._schedules import MetricPlateau, build_hyper, build_scheduler, plateau_neutral
from ref_torch._update import UpdateSpecs, apply_update
from ref_torch.backend import framework_dtype
from ref_torch.ema import init_ema, update_ema
from ref_torch.losses import LossOutput
from ref_torch.optimizers import build_optimizer, to_eval_point, to_train_point
from ref_torch.precision import LossScaler, init_skip_state

class Steps:
    """The framework steps of a run (conformance.run.loop.Steps): model, optimizer, schedule
    and loss scale built, then restored from run.checkpoint when resuming."""

    def __init__(self, run: Run, device: torch.device, model: Any, loss_fn: Callable[[Any, Any], Any] | None) -> None:
        config = self.config = run.config
        self.run, self.device, self.loss_fn = run, device, loss_fn
        rt.seed_everything(config.run.seed + run.rank)
        self.pdtype = framework_dtype(config.precision.param_dtype)
        model = _model.make(config, run.data.info, device, model)
        if run.checkpoint is None and config.model.init is not None:  # a resume has its own weights
            _model.load_pretrained(model, initial_weights(config, run.data.info))
        if run.world_size > 1 and config.run.sync_batchnorm:
            model = _sync_bn.convert(model, device)  # before DDP / FSDP take the module
        if run.world_size > 1 and config.run.parallel == "fsdp":
            _fsdp.check(config)
        # FSDP shards `model` in place
        wrapped = ddp.wrap(model, device, run.world_size, config.run.parallel, config.model.fsdp_units)
        tensors = _model.named(model, config.model.rename)
        self.params = tensors.params
        self.optimizer = build_optimizer(config.optimizer, self.params.items())
        if config.ema.enabled and _fsdp.is_sharded(model):
            raise UnsupportedError("[ema] with run.parallel = 'fsdp' is not supported yet (the EMA of sharded "
                                   "parameters); use 'ddp'")
        self.objs = _train_state.Objects(model, self.optimizer, LossScaler(config.precision, device), tensors,
                                         init_ema(config.ema, self.params))
        per_epoch = run.data.updates_per_epoch if config.schedule.unit == "epoch" else 1
        check_observed(config.schedule, config.run.eval_every, run.data.info.n_val, config.loss.name)
        for note in check_run_length(config.schedule, run.planned, per_epoch):
            if run.metrics is not None:
                run.metrics.note(note)
        self.scheduler = build_scheduler(config.schedule, self.optimizer, per_epoch, start=run.counters.schedule_t)
        # stepped after each update: the lr's scheduler, with [schedule.hyper]'s when there are any
        self.stepped = build_hyper(config.schedule, self.optimizer, self.scheduler, per_epoch, run.counters.schedule_t)
        forward = rt.maybe_compile(wrapped, config)
        self.skips = init_skip_state()
        if run.checkpoint is not None:
            # RNG last: nothing may draw after it
            self.skips = _train_state.restore(run.checkpoint, self.objs, run.rank)
            if isinstance(self.scheduler, MetricPlateau):
                _train_state.restore_plateau(run.checkpoint, self.scheduler)
        model.train()
        self.specs = UpdateSpecs(config.accumulation, config.clip, config.precision)
        self.world = ddp.World(run.world_size, device, wrapped)  # how an update reduces over the ranks
        self.device_name = rt.device_name(device)
        self.observing = isinstance(self.scheduler, MetricPlateau)  # reduce_on_plateau observes each evaluation
        self.batch_loss = _model.batch_loss_fn(config, forward, loss_fn)
        self.plain = _plain_loss(self.batch_loss)  # one process, nobody watching, nothing injected: the lean call

    def update(self, t: int) -> Update:
        """Run update t over run.data.window(t) (raising NonFiniteError under the policy)."""
        config, run, params, optimizer = self.config, self.run, self.params, self.optimizer
        t0 = time.perf_counter()
        window = run.data.window(t)  # the data position is the update count: a pure function of t
        batches, counts = _prepare(config, run, window, self.device, self.pdtype, self.loss_fn is not None)
        lrs = [float(g["lr"]) for g in optimizer.param_groups]  # the lr update t applies
        t1 = time.perf_counter()
        inject = injected(config, t)
        loss_fn = self.plain if run.world_size == 1 and run.events is None and not inject else \
            _loss_fn(config, self.batch_loss, run, inject, t, self.loss_fn, self.device)
        to_train_point(optimizer, params)  # schedule-free: the update's gradient point y from x (else nothing)
        self.skips, info = apply_update(self.specs, params, optimizer, self.stepped, self.objs.scaler, self.skips,
                                        loss_fn, batches, counts, update=t, world=self.world)
        if self.objs.ema is not None and not info.skipped:
            update_ema(config.ema, self.objs.ema, params, ema_due(config.ema, t))
        # between updates a schedule-free run holds x: evaluations, saves and a preemption read it as it
        # is, so none of them rounds y (a resume from any of them continues bit for bit)
        to_eval_point(optimizer, params)
        return Update(window, info._asdict(), lrs, t1 - t0, time.perf_counter() - t1)

    def evaluate(self, t: int) -> EvalTotals:
        """Validation sums after update t over every rank, with the weights evaluations see."""
        with _evaluation_weights(self.config, self.objs):
            return _evaluate(self.config, self.run, self.objs.model, self.device, self.pdtype, self.loss_fn)

    def observe(self, record: Mapping[str, Any]) -> None:
        """An evaluation's record, for a schedule that watches it (reduce_on_plateau)."""
        if self.observing:
            self.scheduler.step(record[self.config.schedule.monitor])

    def save(self, updates_done: int, val_loss: float | None) -> Path | None:
        """Checkpoint the state after `updates_done` updates; collective (rank 0's path, else None)."""
        state = plateau.to_json(plateau_neutral(self.scheduler)) if self.observing else None
        return _train_state.save_checkpoint(self.run, updates_done, self.objs, self.device, val_loss, state)

    def peak_memory_bytes(self) -> int:
        """The accelerator's peak bytes in use so far (the CPU: the process's peak RSS)."""
        return rt.peak_memory_bytes(self.device)

    def final_params(self) -> dict[str, Any]:
        """The training weights as NumPy arrays by neutral name, once the last update is done."""
        to_train_point(self.optimizer, self.params)  # the training weights (a schedule-free optimizer's y)
        return _train_state.params_numpy(self.objs)


def _prepare(config: Config, run: Run, window: Any, device: torch.device, dtype: torch.dtype,
             user_loss: bool) -> tuple[list[tuple[Any, Any]], Any]:
    """The window's micro-batches on the device, each with its global count where the loss needs it,
    and the counts for tokens normalization (a tensor across ranks: only the global total may be 0).
    A loss_fn's counts are known only after its forward pass: tokens divides once after the window
    (counts None), micro_batches all-reduces each micro-batch's count across ranks when it has it."""
    tokens = config.accumulation.normalize == "tokens"
    world = run.world_size
    counts = window_counts(config, window) if (tokens or world > 1) and not user_loss else None
    global_counts: list[Any] = [None] * len(window.batches)
    if world > 1 and not tokens and not user_loss:
        # micro_batches across ranks: each micro-batch is the mean over its global samples
        global_counts = list(ddp.sum_over_ranks(torch.tensor(counts, dtype=torch.float64), device))
    batches = [(_model.to_device(_fields(b), device, dtype), c) for b, c in zip(window.batches, global_counts)]
    if tokens and world > 1 and counts is not None:
        return batches, torch.tensor(counts, dtype=torch.float64).to(device, non_blocking=True)
    return batches, counts if tokens else None


def _fields(batch: Any) -> Any:
    return batch.fields if batch.fields is not None else {"x": batch.x, "y": batch.y}


def _plain_loss(batch_loss: Callable[[Any], Any]) -> Callable[[Any, tuple[Any, Any]], LossOutput]:
    def loss_fn(_params: Any, mb: tuple[Any, Any]) -> LossOutput:
        return batch_loss(mb[0])[0]

    return loss_fn


def _loss_fn(config: Config, batch_loss: Callable[[Any], Any], run: Run, inject: bool, update: int,
             user: Callable[[Any, Any], Any] | None, device: torch.device) -> Any:
    # the general micro-batch loss: events, data-parallel scaling, injected overflows
    spec, world, events = config.loss, run.world_size, run.events
    calls = [0]

    def loss_fn(_params: Any, mb: tuple[Any, Any]) -> LossOutput:
        batch, global_count = mb
        if events is not None:
            notify(events, "micro_batch", update=update, index=calls[0])
        calls[0] += 1
        res = batch_loss(batch)[0]
        if world > 1 and config.accumulation.normalize != "tokens":
            # DDP averages the ranks' gradients: this rank's share of the global micro-batch loss, × world
            if global_count is None:  # a loss_fn's count, known only now
                global_count = ddp.sum_over_ranks(res.count.detach(), device)
            denom = 1.0 if spec.reduction == "sum" and user is None else global_count.to(res.sum.dtype)
            res = LossOutput(res.sum * world / denom, res.sum, res.count)
        if inject:  # [run] inject_nonfinite: as a float16 overflow would
            res = LossOutput(res.value * math.inf, res.sum * math.inf, res.count)
        return res

    return loss_fn


@contextmanager
def _evaluation_weights(config: Config, objs: Any) -> Iterator[None]:
    """The weights an evaluation sees: the EMA's with [ema] evaluate (once it has started), else the
    parameters as they are between updates (a schedule-free optimizer's x); the training weights
    come back after."""
    params = objs.tensors.params
    use_ema = config.ema.evaluate and objs.ema is not None and bool(objs.ema.started)
    if not use_ema:
        yield
        return
    with torch.no_grad():
        kept = {n: p.detach().clone() for n, p in params.items()}
        for n, p in params.items():
            p.copy_(objs.ema.weights[n])
    try:
        yield
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(kept[n])


def _evaluate(config: Config, run: Run, model: Any, device: torch.device, dtype: torch.dtype,
              user: Callable[[Any, Any], Any] | None) -> EvalTotals:
    """Validation sums over every rank's batches: Σ loss sums, Σ counts, correct, predictions."""
    spec = config.loss
    classes = spec.name in INDEX_LOSSES and user is None
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    batch_loss = _model.batch_loss_fn(config, model, user)
    model.eval()
    try:
        with torch.inference_mode():
            for batch in run.data.val_batches():
                res, out, y = batch_loss(_model.to_device(_fields(batch), device, dtype))
                part = [res.sum, res.count, torch.zeros(()), torch.zeros(())]
                if classes:
                    valid = y != spec.ignore_index
                    part[2:] = [((out.argmax(-1) == y) & valid).sum(), valid.sum()]
                sums += torch.stack([torch.as_tensor(p).to(device=device, dtype=torch.float64) for p in part])
    finally:
        model.train()
    if run.world_size > 1:
        sums = ddp.sum_over_ranks(sums, device)
    loss_sum, count, correct, predictions = sums.tolist()
    return EvalTotals(loss_sum, count, int(correct), int(predictions))
