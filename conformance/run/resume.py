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

# Fields that may differ between a checkpoint's config and the resuming run's.
RESUMABLE_CHANGES: tuple[str, ...] = (
    "run.epochs", "run.max_updates", "run.device", "run.log_every", "run.eval_every", "run.compile",
    "run.progress", "run.tensorboard", "run.deterministic", "run.parallel", "checkpoint.every", "checkpoint.at_end", "checkpoint.keep_last",
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


def load_valid(path: Path) -> ckpt.Checkpoint:
    """A checkpoint verified to the last field: its hashes (load_checkpoint), then its state
    (validate_state)."""
    found = ckpt.load_checkpoint(path)
    validate_state(found)
    return found


def _warn(path: Path, exc: Exception) -> None:
    warnings.warn(f"skipping checkpoint {path}: {exc}", TwinstepWarning, stacklevel=5)


def pick_checkpoint(directory: Path, allow_fallback: bool) -> ckpt.Checkpoint | None:
    """The checkpoint a resume continues from: the newest under `directory` that verifies to the
    last field (conformance.checkpoint.search with load_valid), or None when there is none."""
    found = ckpt.search(directory, load_valid, allow_fallback, _warn)
    return None if found is None else found[1]


def check_resumable(saved_toml: str, config: Config, where: Path) -> None:
    """Refuse to resume when the run would not continue the checkpoint's trajectory."""
    bad = [k for k in config_changes(saved_toml, config) if k not in RESUMABLE_CHANGES]
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
