"""Resume policy: which checkpoint a run may continue from, and its counters.

The newest checkpoint that verifies, to the last field (its hashes, then every field of its state:
conformance.run.validate); `checkpoint.allow_fallback` lets an older one stand in for a refused
newest one, and without it the refusal names the older checkpoint that would verify. Its resolved
config must equal this run's except for the fields in RESUMABLE_CHANGES (a longer run, another
device, logging/checkpoint cadence). A torch checkpoint resumes on JAX and back: the state is
framework-neutral.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from conformance import checkpoint as ckpt
from conformance import tomlio
from conformance.config import Config, dump_config, load_config
from conformance.errors import CheckpointError, TwinstepWarning
from conformance.run.counters import Counters
from conformance.run.validate import validate_state

# Fields that may differ between a checkpoint's config and the resuming run's: none changes the
# trajectory (the run length only extends it; evaluations draw nothing and change no weight), but
# for reduce_on_plateau, which observes the evaluations (OBSERVED). data.batch_size may change with
# the world size (check_resumable).
RESUMABLE_CHANGES: tuple[str, ...] = (
    "run.epochs", "run.max_updates", "run.device", "run.log_every", "run.eval_every", "run.compile",
    "run.progress", "run.tensorboard", "run.loggers", "run.deterministic", "run.parallel", "checkpoint.every", "checkpoint.at_end", "checkpoint.keep_last",
    "checkpoint.keep_best", "checkpoint.allow_fallback", "ema.evaluate",
)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _parse(text: str, where: Path | str) -> dict[str, Any]:
    return tomlio.parse(text, str(where), CheckpointError)


def config_changes(saved_toml: str, config: Config) -> list[str]:
    """Dotted fields whose value differs between a checkpoint's config and `config` (the saved one
    resolved again, so that a field added since with its default is no change)."""
    saved = load_config(_parse(saved_toml, "the checkpoint's config.toml"))
    before = _flatten(_parse(dump_config(saved), "the checkpoint's config.toml"))
    after = _flatten(_parse(dump_config(config), "config"))
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def load_valid(path: Path, lazy: bool = False) -> ckpt.Checkpoint:
    """A checkpoint verified to the last field: its hashes (load_checkpoint), then its state
    (validate_state). `lazy`: a sharded checkpoint's tensors stay ShardedTensors (a resuming rank
    reads only its slices); else whole."""
    found = ckpt.load_checkpoint(path, lazy=lazy)
    validate_state(found)
    return found


def _warn(path: Path, exc: Exception) -> None:
    warnings.warn(f"skipping checkpoint {path}: {exc}", TwinstepWarning, stacklevel=5)


def pick_checkpoint(directory: Path, allow_fallback: bool, lazy: bool = False) -> ckpt.Checkpoint | None:
    """The checkpoint a resume continues from: the newest under `directory` that verifies to the
    last field (conformance.checkpoint.search with load_valid), or None when there is none; whole
    tensors unless `lazy` (load_valid)."""
    found = ckpt.search(directory, lambda path: load_valid(path, lazy), allow_fallback, _warn)
    return None if found is None else found[1]


# What reduce_on_plateau observes (when and which weights are evaluated): resumable only without it.
OBSERVED = frozenset({"run.eval_every", "ema.evaluate"})
GLOBAL_BATCH = ("world size", "data.batch_size", "accumulation.steps")


def check_resumable(saved_toml: str, config: Config, where: Path, saved_world: int = 1, world: int = 1) -> None:
    """Refuse to resume when the run would not continue the checkpoint's trajectory. The world size
    may change (N ranks -> M) when the global batch, world size × data.batch_size ×
    accumulation.steps, stays the same with the same accumulation.steps: data.batch_size then
    changes with it (each global micro-batch is the same samples, split M ways instead of N)."""
    saved_cfg = load_config(_parse(saved_toml, where / "config.toml"))
    before = (saved_world, saved_cfg.data.batch_size, saved_cfg.accumulation.steps)
    after = (world, config.data.batch_size, config.accumulation.steps)
    if before[0] * before[1] * before[2] != after[0] * after[1] * after[2]:
        raise CheckpointError(
            f"{where}: cannot resume: the global batch ({' × '.join(GLOBAL_BATCH)}) was "
            f"{' × '.join(map(str, before))} = {before[0] * before[1] * before[2]} in the checkpoint and is "
            f"{' × '.join(map(str, after))} = {after[0] * after[1] * after[2]} now; keep the product equal "
            f"(e.g. --set data.batch_size={before[0] * before[1] // after[0] if before[0] * before[1] % after[0] == 0 else '?'}"
            f" on {world} ranks)")
    if before[2] != after[2]:
        raise CheckpointError(
            f"{where}: cannot resume: accumulation.steps was {before[2]} in the checkpoint and is {after[2]} now; "
            f"the global batch is the same, but its micro-batches are not (the mean over micro-batches, "
            f"dropout per micro-batch), so it would not be the same run")
    allowed = set(RESUMABLE_CHANGES) - (OBSERVED if saved_cfg.schedule.name == "reduce_on_plateau" else set())
    bad = [k for k in config_changes(saved_toml, config) if k not in allowed and k != "data.batch_size"]
    if bad:
        saved = _flatten(_parse(saved_toml, where / "config.toml"))
        now = _flatten(_parse(dump_config(config), "config"))
        first = bad[0]
        raise CheckpointError(
            f"{where}: cannot resume: {first} was {saved.get(first)!r} in the checkpoint and is "
            f"{now.get(first)!r} now" + (f" (+{len(bad) - 1} more changed fields)" if len(bad) > 1 else "")
            + "; start a new run in another --out directory"
        )


def restore_counters(meta: dict[str, Any], update: int) -> Counters:
    """The run counters of a checkpoint's state.json (checked by validate_state before)."""
    saved = meta["counters"]
    best = saved["best_val_loss"]
    return Counters(
        updates_done=update,
        schedule_t=int(saved["schedule_t"]),
        skipped_total=int(saved["skipped_total"]),
        consecutive_skips=int(saved["consecutive_skips"]),
        best_val_loss=None if best is None else float(best),
    )
