"""The framework-neutral half of a training run: both trainers are plain loops over these parts.

    run = open_run(config, out_dir, backend="torch", resume=True)   # dir, data, checkpoint, metrics
    for t in range(run.start, run.planned):
        window = run.data.window(t)
        ... framework: forward/backward over the window, unscale, clip, step or skip ...
        run.counters = advance(run.counters, skipped, schedule_advanced)
        run.metrics.log_update(update_record(run, t, window, info, lrs, data_s, compute_s))
        if eval_due(run, t): run.metrics.log_eval(eval_record(t, evaluation))
        if checkpoint_due(run, t): save(run, t + 1, model, optimizer, rng, rng_meta, extra_meta)

Counting (CONTRACT.md §2): `t` is the update; the schedule's position is `counters.schedule_t`,
which a skipped update advances only with precision.schedule_on_skip = "advance". A checkpoint
holds the state *after* `update` updates; resuming continues at t = update.

Resume policy: the newest checkpoint that verifies (`checkpoint.allow_fallback` lets an older one
stand in for a corrupt newest one); its resolved config must equal this run's except for the
fields in RESUMABLE_CHANGES (a longer run, another device, logging/checkpoint cadence). A torch
checkpoint resumes on JAX and back: the state is framework-neutral.

Shared by both trainers (so that their runs and checkpoints agree):

- RNG layout: every rank's generator states live in the checkpoint's rng tensors as
  `rank<i>/<name>` and in meta["rng"] as {"rank<i>": {...}} (`pack_rank_rng` / `unpack_rank_rng`),
  for every world size, one process included. A backend ignores the names it does not know.
- `window_counts(config, window)`: each micro-batch's valid-element count, from the targets alone
  (known before the forward pass), for accumulation.normalize = "tokens".
- `injected(config, t)`: `[run] inject_nonfinite`. Every micro-batch loss (value and sum) of a
  listed update is multiplied by +inf before the backward pass, so the window loss is +inf and
  the gradients non-finite, as in a float16 overflow.
- `throughput_extras(...)`: tokens/s for text, MFU for gpt against `PEAK_FLOPS`.
"""

from __future__ import annotations

import math
import os
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from conformance import checkpoint as ckpt
from conformance.data import DataPipeline, Window
from conformance.errors import CheckpointError, ConfigError
from conformance.metrics import MetricsLog
from conformance.spec import Config, dump_config, load_config

# Fields that may differ between a checkpoint's config and the resuming run's.
RESUMABLE_CHANGES: tuple[str, ...] = (
    "run.epochs", "run.max_updates", "run.device", "run.log_every", "run.eval_every", "run.compile",
    "run.progress", "run.tensorboard", "run.deterministic", "run.parallel", "checkpoint.every", "checkpoint.at_end", "checkpoint.keep_last",
    "checkpoint.keep_best", "checkpoint.allow_fallback",
)


class TrainResult(NamedTuple):
    """What `train(...)` returns on both backends: the final parameters as float64-or-native NumPy
    arrays by neutral name, the loss of every update run in this process, and where things went."""

    params: dict[str, Any]
    losses: list[float]
    updates_done: int
    out_dir: Path
    checkpoint: Path | None


class Counters(NamedTuple):
    """Run counters saved in every checkpoint (JSON)."""

    updates_done: int = 0
    schedule_t: int = 0  # the schedule's position: updates that advanced it
    skipped_total: int = 0
    consecutive_skips: int = 0
    best_val_loss: float | None = None


def advance(c: Counters, skipped: bool, schedule_advanced: bool) -> Counters:
    """Counters after one update (skipped or not)."""
    return c._replace(
        updates_done=c.updates_done + 1,
        schedule_t=c.schedule_t + int(schedule_advanced),
        skipped_total=c.skipped_total + int(skipped),
        consecutive_skips=c.consecutive_skips + 1 if skipped else 0,
    )


@dataclass
class Run:
    """Everything a trainer needs besides its framework objects."""

    config: Config
    out_dir: Path
    backend: str
    data: DataPipeline
    metrics: MetricsLog | None
    checkpoint: ckpt.Checkpoint | None
    counters: Counters
    rank: int = 0
    world_size: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def start(self) -> int:
        return self.counters.updates_done

    @property
    def planned(self) -> int:
        return self.data.planned_updates

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_changes(saved_toml: str, config: Config) -> list[str]:
    """Dotted fields whose value differs between a checkpoint's config and `config`."""
    before = _flatten(tomllib.loads(saved_toml))
    after = _flatten(tomllib.loads(dump_config(config)))
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def check_resumable(saved_toml: str, config: Config, where: Path) -> None:
    """Refuse to resume when the run would not continue the checkpoint's trajectory."""
    load_config(tomllib.loads(saved_toml))  # the saved config itself must still be valid
    bad = [k for k in config_changes(saved_toml, config) if k not in RESUMABLE_CHANGES]
    if bad:
        saved = _flatten(tomllib.loads(saved_toml))
        now = _flatten(tomllib.loads(dump_config(config)))
        first = bad[0]
        raise CheckpointError(
            f"{where}: cannot resume: {first} was {saved.get(first)!r} in the checkpoint and is "
            f"{now.get(first)!r} now" + (f" (+{len(bad) - 1} more changed fields)" if len(bad) > 1 else "")
            + "; start a new run in another --out directory"
        )


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file so that a reader sees the old or the new content, never a mix."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_run(config: Config, out_dir: str | Path, backend: str, resume: bool = False, rank: int = 0,
             world_size: int = 1, progress: str = "auto", metrics: bool = True) -> Run:
    """Prepare the output directory, the data, the checkpoint to resume from and the metrics log.

    Rank 0 writes DIR/config.toml and owns metrics and checkpoints; other ranks get metrics=None."""
    out = Path(out_dir)
    data = DataPipeline(config, rank, world_size)
    check_task(config, data.info.task)
    checkpoint = None
    counters = Counters()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        ckpt.prepare_directory(out / "checkpoints")
    if resume:
        path = ckpt.find_latest(out / "checkpoints", allow_fallback=config.checkpoint.allow_fallback)
        if path is not None:
            checkpoint = ckpt.load_checkpoint(path)
            check_resumable(checkpoint.state.config, config, path)
            meta = checkpoint.state.meta or {}
            data.check_position(meta.get("data", {}))
            counters = restore_counters(meta, checkpoint.state.update)
            if counters.updates_done > data.planned_updates:
                raise CheckpointError(
                    f"{path} holds {counters.updates_done} updates, but this config plans "
                    f"{data.planned_updates} (run.epochs / run.max_updates); a run cannot be shortened")
    elif rank == 0 and ckpt.list_checkpoints(out / "checkpoints"):
        raise CheckpointError(
            f"{out / 'checkpoints'} already holds checkpoints; pass --resume to continue that run, "
            f"or choose another --out directory (nothing was overwritten)"
        )
    log = None
    if rank == 0:
        write_text_atomic(out / "config.toml", dump_config(config))
        if metrics:
            log = MetricsLog(out, data.planned_updates, resume_from=counters.updates_done if resume else None,
                             progress=progress, tensorboard=bool(getattr(config.run, "tensorboard", False)),
                             log_every=config.run.log_every)
    return Run(config, out, backend, data, log, checkpoint, counters, rank, world_size)


def restore_counters(meta: dict[str, Any], update: int) -> Counters:
    saved = meta.get("counters", {})
    best = saved.get("best_val_loss")
    return Counters(
        updates_done=update,
        schedule_t=int(saved.get("schedule_t", update)),
        skipped_total=int(saved.get("skipped_total", 0)),
        consecutive_skips=int(saved.get("consecutive_skips", 0)),
        best_val_loss=None if best is None else float(best),
    )


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def update_record(run: Run, t: int, window: Window, info: dict[str, Any], lrs: list[float],
                  data_time_s: float, compute_time_s: float, **extra: Any) -> dict[str, Any]:
    """One `update` line of metrics.jsonl (CONTRACT.md §5). `info`: loss, grad_norm, skipped,
    loss_scale (None when unscaled). A non-finite grad_norm of a skipped update is logged as null."""
    elapsed = data_time_s + compute_time_s
    return {
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


def eval_record(t: int, total: EvalTotals) -> dict[str, Any]:
    """One `eval` line: val_loss = Σ sums / Σ counts (exactly the full validation mean), and
    val_accuracy for classification."""
    rec: dict[str, Any] = {"update": t, "val_loss": total.loss_sum / total.count if total.count else float("nan")}
    if total.predictions:
        rec["val_accuracy"] = total.correct / total.predictions
    return rec


def checkpoint_meta(run: Run, updates_done: int, optimizer_step: int, loss_scale: dict[str, Any] | None,
                    rng_meta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The JSON half of a checkpoint: counters, schedule position, loss scale, data position, RNG."""
    return {
        "backend": run.backend,
        "optimizer_step": int(optimizer_step),
        "schedule": {"t": run.counters.schedule_t},
        "loss_scale": loss_scale,
        "data": run.data.position(updates_done),
        "rng": rng_meta,
        "counters": run.counters._asdict(),
        **extra,
    }


def save(run: Run, updates_done: int, model: dict[str, Any], optimizer: dict[str, Any], rng: dict[str, Any],
         meta: dict[str, Any], versions: dict[str, Any], val_loss: float | None = None) -> Path | None:
    """Write the checkpoint after `updates_done` updates (rank 0 only) and apply retention."""
    if not run.is_main:
        return None
    spec = run.config.checkpoint
    state = ckpt.TrainingState(updates_done, model, optimizer, rng, meta, dump_config(run.config))
    return ckpt.save_checkpoint(run.checkpoint_dir, state, versions=versions, val_loss=val_loss,
                                world_size=run.world_size, keep_last=spec.keep_last, keep_best=spec.keep_best)


# ---------------------------------------------------------------------------------------------
# Shared by both trainers: per-rank RNG layout, window counts, injected overflows, throughput
# ---------------------------------------------------------------------------------------------

def rank_prefix(rank: int) -> str:
    """The name prefix of rank `rank`'s RNG tensors in a checkpoint: "rank0/", "rank1/", ..."""
    return f"rank{int(rank)}/"


def pack_rank_rng(per_rank: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every rank's (rng tensors, rng meta), in rank order, as one checkpoint's rng tensors and meta."""
    tensors: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for rank, (t, m) in enumerate(per_rank):
        tensors.update({f"{rank_prefix(rank)}{k}": v for k, v in t.items()})
        meta[rank_prefix(rank).rstrip("/")] = m
    return tensors, meta


def unpack_rank_rng(tensors: dict[str, Any], meta: dict[str, Any], rank: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Rank `rank`'s (rng tensors, rng meta) from a checkpoint, or None when it holds none for that
    rank (a resume with more ranks than the checkpoint had: that rank starts from its seed)."""
    prefix = rank_prefix(rank)
    mine = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    if not mine:
        return None
    return mine, dict((meta or {}).get(prefix.rstrip("/"), {}))


def injected(config: Config, t: int) -> bool:
    """True when `[run] inject_nonfinite` lists update t (its losses are multiplied by +inf)."""
    return t in config.run.inject_nonfinite


def window_counts(config: Config, window: Window) -> list[float]:
    """Valid-element count of each micro-batch of the window (this rank's part), from the targets
    alone: what accumulation.normalize = "tokens" divides the window's summed loss by (before the
    all-rank reduction). Class targets (and gpt tokens) are counted per index, with class weights
    and ignore_index applied; other losses count every target element."""
    import numpy as np

    from conformance.validate import valid_count

    spec = config.loss
    out = []
    for b in window.batches:
        y = np.asarray(b.y)
        if spec.name in CLASS_LOSSES:
            # the loss sees (N, C) logits; a zero-stride stand-in gives valid_count the shape only
            y = y.reshape(-1)
            pred = np.broadcast_to(np.zeros(1), (y.shape[0], max(len(spec.weight or ()), 2)))
        else:
            pred = np.broadcast_to(np.zeros(1), y.shape)
        out.append(valid_count(spec, pred, y))
    return out


CLASS_LOSSES = ("cross_entropy", "nll")
TASK_LOSSES: dict[str, tuple[str, ...]] = {
    "classification": CLASS_LOSSES,
    "language_model": CLASS_LOSSES,
    "regression": ("mse", "l1", "huber", "smooth_l1"),
}


def check_task(config: Config, task: str) -> None:
    """Refuse a loss that cannot train on the data's targets (class indices vs. real values)."""
    allowed = TASK_LOSSES.get(task, ())
    if config.loss.name not in allowed:
        raise ConfigError(f"loss.name = {config.loss.name!r} does not fit data set {config.data.name!r} "
                          f"({task} targets); use one of {', '.join(allowed)}")


# Dense bf16 peak FLOP/s per device (torchtitan's table, reference/trainer_anchors.md §2); MFU is
# reported against these whatever the compute dtype, and only where the device is known.
PEAK_FLOPS: dict[str, float] = {
    "H200": 989e12, "H100 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12,
    "L40S": 362e12, "A10G": 70e12, "L4": 121e12, "MI300X": 1300e12, "MI325X": 1300e12,
}


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device from its name (the longest matching key), or None."""
    hits = [k for k in PEAK_FLOPS if k.lower() in device_name.lower()]
    return PEAK_FLOPS[max(hits, key=len)] if hits else None


def throughput_extras(config: Config, run: Run, window: Window, elapsed_s: float,
                      device_name: str | None = None) -> dict[str, Any]:
    """Extra keys of an update line: tokens_per_s for text, mfu (fraction of the device's peak) for gpt
    when `device_name` has a known peak (trainers pass it on accelerators only)."""
    if run.data.info.task != "language_model" or elapsed_s <= 0:
        return {}
    block = run.data.info.block_size or config.model.block_size
    tokens_per_s = window.global_samples * block / elapsed_s
    out: dict[str, Any] = {"tokens_per_s": tokens_per_s}
    peak = peak_flops(device_name) if device_name else None
    if peak is not None and config.model.name == "gpt":
        from conformance.models import flops_per_token

        per_device = tokens_per_s / max(run.world_size, 1)
        out["mfu"] = flops_per_token(config.model, run.data.info, block) * per_device / peak
    return out


TRAIN_FAULT_ENV = "TWINSTEP_TRAIN_FAULT"  # test hook, as checkpoint.FAULT_ENV: "T:J" exits at micro-batch J of update T


def train_fault() -> dict[int, int]:
    """{update: micro-batch} at which kill tests make the trainer exit abruptly (empty normally)."""
    value = os.environ.get(TRAIN_FAULT_ENV, "")
    if not value:
        return {}
    update, _, micro = value.partition(":")
    return {int(update): int(micro or 0)}
