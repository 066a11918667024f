"""Resume policy: which checkpoint a run may continue from, and its counters.

The newest checkpoint that verifies (`checkpoint.allow_fallback` lets an older one stand in for a
corrupt newest one); its resolved config must equal this run's except for the fields in
RESUMABLE_CHANGES (a longer run, another device, logging/checkpoint cadence). A torch checkpoint
resumes on JAX and back: the state is framework-neutral.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from conformance.config import Config, dump_config, load_config
from conformance.errors import CheckpointError
from conformance.run.counters import Counters

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


def config_changes(saved_toml: str, config: Config) -> list[str]:
    """Dotted fields whose value differs between a checkpoint's config and `config` (the saved one
    resolved again, so that a field added since with its default is no change)."""
    before = _flatten(tomllib.loads(dump_config(load_config(tomllib.loads(saved_toml)))))
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
