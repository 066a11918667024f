"""Which checkpoint an export reads, and what it takes from it: the model spec and the weights.

A run directory (or its checkpoints/ directory) exports its newest checkpoint that verifies to the last field (the one `--resume`
would continue from: conformance.run.resume.pick_checkpoint, no fallback: a refused newest
checkpoint is an error that names the older one); `--checkpoint PATH` (or a RUN_DIR that is one) names one step-* directory
(verified by conformance.checkpoint.load_checkpoint, as every read). Checkpoints are read only
through these two, so every layout they load exports. The model spec is the checkpoint's own
resolved config with the sizes its weights imply (vocab_size, block_size, in/out features).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from conformance import checkpoint as ckpt
from conformance import tomlio
from conformance.config import Config, load_config
from conformance.config.model import ModelSpec
from conformance.errors import CheckpointError, PathError, UnsupportedError
from conformance.files import check_entry
from conformance.rules.models import dims_from_params


class Source(NamedTuple):
    path: Path  # the checkpoint directory
    update: int
    config: Config
    spec: ModelSpec  # sizes filled in from the weights
    weights: dict[str, np.ndarray]  # neutral names, the model's or the EMA's
    which: str  # "model" or "ema"
    meta: dict[str, Any] | None


def find_checkpoint(run_dir: str | Path | None, checkpoint: str | Path | None) -> ckpt.Checkpoint:
    """The checkpoint to export (see the module docstring)."""
    if checkpoint is not None:
        return ckpt.load_checkpoint(Path(checkpoint))
    if run_dir is None:
        raise PathError("name a run directory (RUN_DIR) or a checkpoint (--checkpoint PATH)")
    from conformance.run.resume import pick_checkpoint

    root = Path(run_dir)
    if not check_entry(root, "directory"):
        raise PathError(f"{root}: no such run directory")
    if ckpt.STEP_RE.match(root.name):  # one step-* directory, as `twinstep checkpoint` takes it
        return ckpt.load_checkpoint(root)
    directory = root / "checkpoints" if check_entry(root / "checkpoints", "directory") else root
    try:
        found = pick_checkpoint(directory, allow_fallback=False)
    except CheckpointError as exc:
        raise type(exc)(_export_hint(str(exc), directory)) from None
    if found is None:
        raise CheckpointError(f"{root}: the run has no checkpoint to export (checkpoints/step-* is empty or "
                              f"missing; a run saves one with checkpoint.every or checkpoint.at_end)")
    return found


def _export_hint(message: str, directory: Path) -> str:
    """A refused newest checkpoint's message with the older one that verifies named for export
    (the resume hint names `checkpoint.allow_fallback`, a training flag)."""
    head, sep, tail = message.partition("; the older checkpoint ")
    if not sep:
        return message
    name = tail.split(" ", 1)[0]
    return f"{head}; the older checkpoint {name} verifies: export it with --checkpoint {directory / name}"


def read_source(run_dir: str | Path | None, checkpoint: str | Path | None, ema: bool) -> Source:
    """The checkpoint's spec and weights (the EMA's with `ema`; CheckpointError when it has none)."""
    found = find_checkpoint(run_dir, checkpoint)
    config = load_config(tomlio.parse(found.state.config, str(found.path / "config.toml"), CheckpointError))
    spec = config.model
    if spec.name == "user":
        raise UnsupportedError(f"{found.path}: model.name = 'user' (a model given to train() in Python) has no "
                               f"architecture twinstep knows; its weights are the checkpoint's model.safetensors, "
                               f"by neutral name")
    weights = found.state.model
    if ema:
        if found.state.ema is None:
            raise CheckpointError(f"{found.path} holds no EMA weights (the run kept none: [ema] decay unset, or "
                                  f"the checkpoint is from before ema.start); export without --ema")
        weights = found.state.ema
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    spec = spec.model_copy(update=dims_from_params(spec, shapes))
    return Source(found.path, found.state.update, config, spec, dict(weights), "ema" if ema else "model",
                  found.state.meta)
