"""The framework-neutral checkpoint format: one verified directory per saved update.

    checkpoints/step-00000123/      the state after 123 updates (resume runs update 123 next)
        model.safetensors           model parameters by neutral name
        optimizer.safetensors       "optimizer/<param>/<state_name>" (docs/contract.md §4 names)
        rng.safetensors             "rng/<name>": generator states as uint8/uint32 tensors
        state.json                  counters, optimizer step, scheduler, loss scale, data position, RNG metadata
        config.toml                 the resolved config
        ema.safetensors             "ema/<param>": the weights' EMA, when the run keeps one ([ema])
        manifest.json               written last: every file's size and sha256, format version,
                                    library versions, config hash, update count

Sharded (format 3, FSDP: conformance.checkpoint.shards, saved by sharded_save.save_sharded from
every rank): rank-<r>.safetensors per rank and replicated.safetensors instead of model, optimizer
and ema; the manifest's `tensors` table says which box of which tensor each file holds.
`load_checkpoint` returns whole tensors from either layout; `load_checkpoint(path, lazy=True)`
leaves a sharded checkpoint's tensors as ShardedTensors that read only the slices asked for.

A save writes everything into `.tmp-…` beside the final name (each file fsync'ed, the manifest
last), renames it into place and fsyncs the parent (reliability.md §1.9). A load opens the directory
without following a link and every file relative to it (never blocking: a FIFO is refused at once),
checks each file's type, owner, mode, size and sha256 against the manifest BEFORE parsing any of
them, and the manifest against its own hash and strict schema (manifest.py). Nothing is pickled.
`latest.find_latest` returns the newest checkpoint that verifies.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from conformance.checkpoint import files as io
from conformance.checkpoint.manifest import (
    FILES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    STEP_RE,
    encode_manifest,
    parse_manifest,
)
from conformance.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointRejected,
    TwinstepWarning,
)
from conformance.events import Events, notify
from conformance.files import check_entry

__all__ = ["FILES", "FORMAT", "FORMAT_VERSION", "MANIFEST", "STEP_RE"]  # re-exported from manifest.py


class TrainingState(NamedTuple):
    """Everything a checkpoint holds. `update`: updates completed. `model`: {name: array}.
    `optimizer`: {param: {state_name: array}} (neutral names). `rng`: {name: uint8/uint32 array}.
    `meta`: JSON-able counters and states (optimizer step, scheduler, loss scale, data position,
    RNG metadata ...). `config`: the resolved config as TOML text. `ema`: the weights' EMA or None."""

    update: int
    model: dict[str, np.ndarray]
    optimizer: dict[str, dict[str, np.ndarray]] | None = None
    rng: dict[str, np.ndarray] | None = None
    meta: dict[str, Any] | None = None
    config: str = ""
    ema: dict[str, np.ndarray] | None = None


class Checkpoint(NamedTuple):
    """A loaded, verified checkpoint: where it was, its manifest, and its state."""

    path: Path
    manifest: dict[str, Any]
    state: TrainingState


def step_name(update: int) -> str:
    """Directory name for the state after `update` updates: step-00000123."""
    return f"step-{update:08d}"


def library_versions() -> dict[str, str]:
    """Versions of the neutral side (python, numpy, safetensors, twinstep); backends add their own."""
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("safetensors", "twinstep"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions


def _optimizer_tensors(optimizer: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    out = {}
    for param, states in optimizer.items():
        for name, value in states.items():
            if "/" in name or not name:
                raise CheckpointError(f"optimizer state name {name!r} of {param!r} must be non-empty without '/'")
            out[f"optimizer/{param}/{name}"] = value
    return out


def save_checkpoint(directory: str | Path, state: TrainingState, *, versions: dict[str, Any] | None = None,
                    val_loss: float | None = None, world_size: int = 1, keep_last: int | None = None,
                    keep_best: bool = False, events: Events | None = None) -> Path:
    """Write `state` as directory/step-<update>/ atomically and durably; then, if `keep_last` is
    given, apply retention (after the commit, never deleting the new checkpoint). Returns the path.
    Only one process (rank 0) may save into a directory. `events` observes the stages of the save
    (conformance.events.CHECKPOINT_STAGES)."""
    directory = Path(directory)
    if state.update < 0:
        raise CheckpointError(f"checkpoint update must be >= 0; received {state.update}")
    try:
        return _save(directory, state, versions, val_loss, world_size, keep_last, keep_best, events)
    except OSError as exc:  # a full disk, a read-only or vanished directory: one line naming it
        raise CheckpointError(f"{directory}: cannot save checkpoint {step_name(state.update)} "
                              f"({exc.strerror or exc}); the checkpoints already saved are intact") from None


def _save(directory: Path, state: TrainingState, versions: dict[str, Any] | None, val_loss: float | None,
          world_size: int, keep_last: int | None, keep_best: bool, events: Events | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=io.DIR_MODE)
    # tensor files are streamed from the arrays (files.write_tensors: no serialized copy in memory)
    payload: dict[str, bytes | Tensors] = {
        "model.safetensors": Tensors("model", state.model),
        "optimizer.safetensors": Tensors("optimizer", _optimizer_tensors(state.optimizer or {})),
        "rng.safetensors": io.encode_tensors({f"rng/{k}": v for k, v in (state.rng or {}).items()}, "rng"),
        "state.json": io.encode_json(state.meta or {}, "checkpoint meta"),
        "config.toml": state.config.encode("utf-8"),
    }
    if state.ema is not None:
        payload["ema.safetensors"] = Tensors("ema", {f"ema/{k}": v for k, v in state.ema.items()})
    final = directory / step_name(state.update)
    tmp = directory / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(mode=io.DIR_MODE)
    try:
        _write_all(tmp, final, state.update, payload, versions, val_loss, world_size, events)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves nothing behind
        raise
    notify(events, "checkpoint", stage="after_rename")
    if keep_last is not None:
        apply_retention(directory, keep_last, keep_best, protect=final, events=events)
    return final


class Tensors(NamedTuple):
    """A tensor file to stream (files.write_tensors); `what` names it in errors."""

    what: str
    tensors: dict[str, np.ndarray]


def _write_all(tmp: Path, final: Path, update: int, payload: dict[str, bytes | Tensors],
               versions: dict[str, Any] | None, val_loss: float | None, world_size: int,
               events: Events | None) -> None:
    files = {}
    for i, (name, data) in enumerate(payload.items()):
        files[name] = (io.write_tensors(tmp, name, data.tensors, data.what) if isinstance(data, Tensors)
                       else io.write_file(tmp, name, data))
        notify(events, "checkpoint", stage="after_first_file" if i == 0 else "during_files")
    notify(events, "checkpoint", stage="before_manifest")
    manifest = encode_manifest(update=update, files=files, created_unix=time.time(), world_size=world_size,
                               val_loss=val_loss, versions={**library_versions(), **(versions or {})})
    io.write_file(tmp, MANIFEST, manifest)
    io.fsync_dir(tmp)
    notify(events, "checkpoint", stage="after_manifest")
    commit_step(tmp, final)


def commit_step(tmp: Path, final: Path) -> None:
    # A directory rename cannot replace a non-empty one: move an old copy aside first; if we die in
    # between, prepare_directory() moves it back.
    aside = None
    if final.exists() or final.is_symlink():
        aside = final.parent / f".tmp-replaced-{final.name}-{uuid.uuid4().hex[:8]}"
        os.rename(final, aside)
    os.rename(tmp, final)
    io.fsync_dir(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def opened_dir(path: Path) -> Iterator[int]:
    # The step directory opened without following a link: its files are then opened relative to
    # this descriptor, so no link on the way can lead out of it.
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path} does not exist") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            io.check_stat(os.lstat(path), path, "directory")  # names what it is instead
        raise CheckpointRejected(f"{path}: cannot open ({exc.strerror})") from None
    try:
        io.check_stat(os.fstat(fd), path, "directory")
        yield fd
    finally:
        os.close(fd)


def read_manifest(path: Path, fd: int) -> dict[str, Any]:
    data = io.read_file(path / MANIFEST, MAX_MANIFEST_BYTES, dir_fd=fd)
    try:
        manifest = parse_manifest(data, path / MANIFEST, path.name)
    except RecursionError:
        raise CheckpointCorruptError(f"{path / MANIFEST} is nested too deeply to be a manifest") from None
    listed = set(manifest["files"]) | {MANIFEST}
    for entry in sorted(os.listdir(fd)):
        if entry not in listed:
            raise CheckpointRejected(f"{path / entry} is not listed in the manifest")
    return manifest


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(update, path) of every step-* entry, newest first; temporary directories are not listed. A
    `directory` that is a symbolic link or not a directory is refused (CheckpointRejected)."""
    directory = Path(directory)
    if not check_entry(directory, "directory", CheckpointRejected):
        return []
    found = [(int(m.group(1)), directory / e.name) for e in os.scandir(directory) if (m := STEP_RE.match(e.name))]
    return sorted(found, reverse=True)


def _is_complete(path: Path) -> dict[str, Any] | None:
    # Retention's quick check: a valid manifest and every file of the listed size (no hashing).
    try:
        with opened_dir(path) as fd:
            manifest = read_manifest(path, fd)
            for name, entry in manifest["files"].items():
                if os.lstat(name, dir_fd=fd).st_size != entry["size"]:
                    return None
        return manifest
    except (CheckpointError, OSError):
        return None


def _remove(path: Path, events: Events | None) -> None:
    # Rename first: a kill mid-delete then leaves a .tmp directory, never a half-deleted checkpoint.
    aside = path.parent / f".tmp-deleting-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, aside)
        notify(events, "checkpoint", stage="during_retention")
        shutil.rmtree(aside)
    except OSError as exc:
        warnings.warn(f"checkpoint retention could not delete {path}: {exc.strerror or exc}", TwinstepWarning,
                      stacklevel=3)


def apply_retention(directory: str | Path, keep_last: int, keep_best: bool = False,
                    protect: Path | None = None, events: Events | None = None) -> list[Path]:
    """Delete old checkpoints, keeping the newest `keep_last` complete ones, the one with the
    lowest val_loss if `keep_best`, and `protect`. Checkpoints newer than `protect` are left alone.
    A failed deletion is a warning, not an error. Returns the deleted paths."""
    if keep_last < 1:
        raise CheckpointError(f"checkpoint.keep_last must be >= 1; received {keep_last}")
    entries = list_checkpoints(directory)
    limit = int(STEP_RE.match(protect.name).group(1)) if protect is not None and STEP_RE.match(protect.name) else None
    entries = [(u, p) for u, p in entries if limit is None or u <= limit]
    complete = [(u, p, m) for u, p in entries if (m := _is_complete(p)) is not None]
    keep = {p for _, p, _ in complete[:keep_last]}
    if protect is not None:
        keep.add(Path(protect))
    if keep_best:
        scored = [(m["val_loss"], -u, p) for u, p, m in complete if isinstance(m.get("val_loss"), (int, float))]
        if scored:
            keep.add(min(scored)[2])
    newest_kept = max((u for u, p in entries if p in keep), default=None)
    deleted = []
    for u, p in entries:
        if p not in keep and (newest_kept is None or u < newest_kept):
            _remove(p, events)
            deleted.append(p)
    return deleted


def prepare_directory(directory: str | Path) -> list[Path]:
    """Create the checkpoint directory (0o700) and clean up after a crash: a checkpoint moved aside
    for replacement goes back if its replacement never arrived; other .tmp-* entries are removed.
    Call once at the start of a run, before the first save. Returns what was removed."""
    directory = Path(directory)
    if not check_entry(directory, "directory", CheckpointRejected):
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=io.DIR_MODE)
        except OSError as exc:
            raise CheckpointError(f"{directory}: cannot create ({exc.strerror})") from None
    removed = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if not entry.name.startswith(".tmp-"):
            continue
        path = directory / entry.name
        match = re.match(r"^\.tmp-replaced-(step-\d{8,})-[0-9a-f]{8}$", entry.name)
        if match and not (directory / match.group(1)).exists():
            os.rename(path, directory / match.group(1))
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    if removed:
        io.fsync_dir(directory)
    return removed


def check_tensors(expected: dict[str, tuple[tuple[int, ...], str]], tensors: dict[str, np.ndarray],
                  prefix: str = "model/") -> None:
    """Refuse a tensor set whose names, shapes or dtypes differ from `expected` ({name: (shape,
    dtype name)}), naming the first offending tensor (e.g. 'model/0.weight')."""
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint lacks tensor {prefix}{missing[0]} ({len(missing)} missing in all)")
    extra = [k for k in tensors if k not in expected]
    if extra:
        raise CheckpointError(f"checkpoint tensor {prefix}{extra[0]} is not a parameter of this model")
    for name, (shape, dtype) in expected.items():
        got = tensors[name] if hasattr(tensors[name], "dtype") else np.asarray(tensors[name])  # lazy: not read
        if tuple(got.shape) != tuple(shape):
            raise CheckpointError(
                f"checkpoint tensor {prefix}{name} has shape {tuple(got.shape)}; the model needs {tuple(shape)}"
            )
        if got.dtype.name != dtype:
            raise CheckpointError(
                f"checkpoint tensor {prefix}{name} is {got.dtype.name}; the model's parameter is {dtype}"
            )
