"""Which checkpoint a resume continues from: the newest that verifies, or a clear refusal.

`search` walks the checkpoints newest first and returns the first that `load` accepts
(format.verify_checkpoint by default; a run passes its full check, conformance.run.validate). A
refused newest checkpoint stops the search with its error, which also names the older checkpoint
that would verify and the flag to use it (`checkpoint.allow_fallback`); with the fallback allowed the
refusal is a one-line warning and the search goes on.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.checkpoint.format import list_checkpoints, verify_checkpoint
from conformance.errors import CheckpointCorruptError, CheckpointError, TwinstepWarning


def _warn_skip(path: Path, exc: Exception) -> None:
    warnings.warn(f"skipping checkpoint {path}: {exc}", TwinstepWarning, stacklevel=4)


def search(directory: str | Path, load: Callable[[Path], Any] | None = None, allow_fallback: bool = False,
           on_skip: Callable[[Path, Exception], None] | None = None) -> tuple[Path, Any] | None:
    """(path, load(path)) of the newest checkpoint under `directory` that `load` accepts (default:
    verify_checkpoint), or None if there is none. If the newest is refused its error is raised,
    naming the older checkpoint that would verify and the flag that uses it, unless
    `allow_fallback`: then it is reported to `on_skip` (default: a one-line TwinstepWarning) and
    older ones are tried."""
    load = load or verify_checkpoint
    found = list_checkpoints(directory)
    errors: list[CheckpointError] = []
    for i, (_, path) in enumerate(found):
        try:
            return path, load(path)
        except CheckpointError as exc:
            if not allow_fallback:
                raise type(exc)(f"{exc}; {_fallback_hint(found[i + 1:], load)}") from None
            errors.append(exc)
            (on_skip or _warn_skip)(path, exc)
    if errors:
        raise CheckpointCorruptError(f"no checkpoint under {directory} verifies; the newest: {errors[0]}")
    return None


def _fallback_hint(older: list[tuple[int, Path]], load: Callable[[Path], Any]) -> str:
    for _, path in older:
        try:
            load(path)
        except CheckpointError:
            continue
        return (f"the older checkpoint {path.name} verifies: resume from it with --set "
                f"checkpoint.allow_fallback=true (the refused one is left in place)")
    return "no older checkpoint verifies either" if older else "there is no older checkpoint to fall back to"


def find_latest(directory: str | Path, allow_fallback: bool = False,
                on_skip: Callable[[Path, Exception], None] | None = None) -> Path | None:
    """The newest checkpoint under `directory` that verifies, or None if there is none (`search`
    with verify_checkpoint: the same refusals, hint and fallback)."""
    found = search(directory, None, allow_fallback, on_skip)
    return None if found is None else found[0]
