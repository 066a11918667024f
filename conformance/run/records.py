"""What a run writes besides tensors: metrics lines (docs/contract.md §5), evaluation totals, when to evaluate
and checkpoint, and the JSON half of a checkpoint.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from conformance import checkpoint as ckpt
from conformance.config import dump_config
from conformance.data import Window
from conformance.errors import TwinstepWarning
from conformance.rules.inputs import first_nonfinite
from conformance.run.session import Run


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _not_written(updates_done: int, bad: str) -> None:
    warnings.warn(f"checkpoint after update {updates_done} not written: {bad} holds non-finite values, which no "
                  f"resume could continue from; the checkpoints already written are kept", TwinstepWarning,
                  stacklevel=3)


def update_record(run: Run, t: int, window: Window, info: Mapping[str, Any], lrs: list[float],
                  data_time_s: float, compute_time_s: float, **extra: Any) -> dict[str, Any]:
    """One `update` line of metrics.jsonl (docs/contract.md §5). `info`: loss, grad_norm, skipped,
    loss_scale (None when unscaled). A non-finite grad_norm of a skipped update is logged as null."""
    elapsed = data_time_s + compute_time_s
    return {
        "event": "update",
        "update": t,
        "epoch": window.epoch,
        "samples_seen": run.data.samples_seen(t + 1),
        "loss": float(info["loss"]),
        "lr": [float(x) for x in lrs],
        "grad_norm": _finite_or_none(info["grad_norm"]),
        "loss_scale": info.get("loss_scale"),
        "skipped": bool(info["skipped"]),
        "data_time_s": data_time_s,
        "compute_time_s": compute_time_s,
        "samples_per_s": window.global_samples / elapsed if elapsed > 0 else None,
        **extra,
    }


def eval_due(run: Run, t: int) -> bool:
    """Evaluate after update t every run.eval_every updates, and after the last one (if eval_every > 0)."""
    every = run.config.run.eval_every
    return every > 0 and run.data.info.n_val > 0 and ((t + 1) % every == 0 or t + 1 == run.planned)


def checkpoint_due(run: Run, t: int) -> bool:
    """Save after update t every checkpoint.every updates, and after the last one (checkpoint.at_end)."""
    spec = run.config.checkpoint
    return (spec.every > 0 and (t + 1) % spec.every == 0) or (spec.at_end and t + 1 == run.planned)


class EvalTotals(NamedTuple):
    """Validation sums over batches: loss sum and count (mean = sum / count), correct predictions."""

    loss_sum: float = 0.0
    count: float = 0.0
    correct: int = 0
    predictions: int = 0


def add_eval(total: EvalTotals, loss_sum: float, count: float, correct: int = 0, predictions: int = 0) -> EvalTotals:
    return EvalTotals(total.loss_sum + loss_sum, total.count + count, total.correct + correct,
                      total.predictions + predictions)


def eval_record(t: int, total: EvalTotals, language_model: bool = False) -> dict[str, Any]:
    """One `eval` line: val_loss = Σ sums / Σ counts (exactly the full validation mean),
    val_accuracy for classification, and val_perplexity = exp(val_loss) for a language model (the
    loss is the mean token cross-entropy in nats)."""
    rec: dict[str, Any] = {"update": t, "val_loss": total.loss_sum / total.count if total.count else float("nan")}
    if total.predictions:
        rec["val_accuracy"] = total.correct / total.predictions
    if language_model:
        rec["val_perplexity"] = math.exp(rec["val_loss"]) if not rec["val_loss"] > 709.0 else math.inf
    return rec


def checkpoint_meta(run: Run, updates_done: int, optimizer_step: int, loss_scale: dict[str, Any] | None,
                    rng_meta: dict[str, Any], plateau: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """The JSON half of a checkpoint: counters, schedule position (and reduce_on_plateau's state,
    conformance.rules.plateau), loss scale, data position, RNG."""
    return {
        "backend": run.backend,
        "optimizer_step": int(optimizer_step),
        "schedule": {"t": run.counters.schedule_t, **({"plateau": plateau} if plateau is not None else {})},
        "loss_scale": loss_scale,
        "data": run.data.position(updates_done),
        "rng": rng_meta,
        "counters": run.counters._asdict(),
        **extra,
    }


def save(run: Run, updates_done: int, model: dict[str, Any], optimizer: dict[str, Any], rng: dict[str, Any],
         meta: dict[str, Any], versions: dict[str, Any], val_loss: float | None = None,
         ema: dict[str, Any] | None = None) -> Path | None:
    """Write the checkpoint after `updates_done` updates (rank 0 only) and apply retention; `ema`:
    the weights' EMA ([ema]; None before it starts). The metrics written so far are made durable
    first (fsync), so the file never lags a checkpoint. state.json repeats the manifest's val_loss
    (conformance.run.validate cross-checks them). A state holding a NaN or an inf is not written
    (None, with a one-line warning): no resume accepts it, and retention would rotate finite ones away."""
    if not run.is_main:
        return None
    if run.metrics is not None:
        run.metrics.sync()
    # a failing run never writes a state no resume accepts, so retention never rotates a finite one away
    bad = first_nonfinite({"model": model, "optimizer": optimizer, "ema": ema or {}})
    if bad is not None:
        _not_written(updates_done, bad)
        return None
    spec = run.config.checkpoint
    val = _finite_or_none(val_loss)
    state = ckpt.TrainingState(updates_done, model, optimizer, rng, {**meta, "val_loss": val}, dump_config(run.config),
                               ema)
    return ckpt.save_checkpoint(run.checkpoint_dir, state, versions=versions, val_loss=val,
                                world_size=run.world_size, keep_last=spec.keep_last, keep_best=spec.keep_best,
                                events=run.events)


def save_sharded(run: Run, updates_done: int, pieces: dict[str, Any], rng: dict[str, Any], meta: dict[str, Any],
                 versions: dict[str, Any], exchange: Any, val_loss: float | None = None) -> Path | None:
    """Write the checkpoint after `updates_done` updates from every rank, each its own `pieces`
    (conformance.checkpoint.save_sharded; `exchange`: the framework's all-gather of bytes). `rng`,
    `meta` and `versions` matter on rank 0 only. Collective: every rank calls it. Like `save`,
    nothing is written (None, a warning) when any rank's slice holds a non-finite value."""
    if run.is_main and run.metrics is not None:
        run.metrics.sync()
    bad = first_nonfinite({key: box for key, (box, _, _) in pieces.items()})
    everywhere = [b.decode("utf-8") for b in exchange((bad or "").encode("utf-8"))]  # every rank decides alike
    bad = next((b for b in everywhere if b), None)
    if bad is not None:
        if run.is_main:
            _not_written(updates_done, bad)
        return None
    spec = run.config.checkpoint
    val = _finite_or_none(val_loss)
    state = ckpt.TrainingState(updates_done, {}, None, rng, {**meta, "val_loss": val} if run.is_main else {},
                               dump_config(run.config))
    return ckpt.save_sharded(run.checkpoint_dir, state, pieces, rank=run.rank, world_size=run.world_size,
                             exchange=exchange, versions=versions, val_loss=val, keep_last=spec.keep_last,
                             keep_best=spec.keep_best, events=run.events)
