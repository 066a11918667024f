"""Reading a checkpoint back: verified before anything is parsed, whole tensors from either layout.

    manifest = verify_checkpoint(path)            # every file's hash (and a sharded one's tiling), nothing parsed
    found = load_checkpoint(path)                 # Checkpoint(path, manifest, TrainingState): whole tensors
    found = load_checkpoint(path, lazy=True)      # a sharded one's tensors as ShardedTensors (slices on demand)

Every file the manifest lists must exist before any is read (a sharded checkpoint missing one rank's
file is refused at once, naming it); each file is then read once through the directory's descriptor
(no link followed, format.opened_dir) and checked against its size and sha256 before it is parsed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from conformance.checkpoint import files as io
from conformance.checkpoint.format import (
    Checkpoint,
    TrainingState,
    opened_dir,
    read_manifest,
)
from conformance.checkpoint.manifest import SHARDED_FILES, SHARDED_VERSION
from conformance.checkpoint.shards import ShardSet, split_tensors
from conformance.errors import CheckpointCorruptError


def _split_optimizer(tensors: dict[str, np.ndarray], path: Path) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        if not key.startswith("optimizer/") or key.count("/") < 2:
            raise CheckpointCorruptError(f"{path}: tensor {key!r} is not named optimizer/<param>/<state>")
        param, name = key[len("optimizer/"):].rsplit("/", 1)
        out.setdefault(param, {})[name] = value
    return out


def _strip_prefix(tensors: dict[str, np.ndarray], prefix: str, path: Path) -> dict[str, np.ndarray]:
    bad = [k for k in tensors if not k.startswith(prefix)]
    if bad:
        raise CheckpointCorruptError(f"{path}: tensor {bad[0]!r} is not named {prefix}<name>")
    return {k[len(prefix):]: v for k, v in tensors.items()}


def _verified_files(path: Path, lazy: bool = False) -> tuple[dict[str, Any], dict[str, bytes]]:
    # Every listed file must be there before any is read (a sharded
    # checkpoint missing a rank's file is refused here); then each is read once and hashed. `lazy`:
    # of a sharded checkpoint only the small files (its tensor files are read on demand, ShardSet).
    with opened_dir(path) as fd:
        manifest = read_manifest(path, fd)
        for name in sorted(manifest["files"]):
            try:
                os.lstat(name, dir_fd=fd)  # kinds, owners, sizes: checked on reading
            except FileNotFoundError:
                raise CheckpointCorruptError(f"{path / name} does not exist (the manifest lists it)") from None
        names = SHARDED_FILES if lazy and _sharded(manifest) else tuple(manifest["files"])
        data = {name: io.read_verified(path, name, manifest["files"][name]["size"],
                                       manifest["files"][name]["sha256"], dir_fd=fd) for name in names}
    return manifest, data


def _sharded(manifest: dict[str, Any]) -> bool:
    return manifest["format_version"] >= SHARDED_VERSION


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """Check a checkpoint directory completely (paths, types, owner, modes, sizes, sha256) without
    parsing any file but the manifest; return the manifest or raise CheckpointCorruptError /
    CheckpointRejected naming the file."""
    return _verified_files(Path(path))[0]


def load_checkpoint(path: str | Path, *, lazy: bool = False) -> Checkpoint:
    """Verify a checkpoint directory (verify_checkpoint), then parse the verified bytes. Whole
    tensors from either layout; with `lazy`, a sharded checkpoint's tensors are ShardedTensors
    (conformance.checkpoint.shards: `.read(index)` reads only the files holding that slice)."""
    path = Path(path)
    manifest, data = _verified_files(path, lazy)
    rng = _strip_prefix(io.decode_tensors(data["rng.safetensors"], path / "rng.safetensors"), "rng/",
                        path / "rng.safetensors")
    meta = io.decode_json(data["state.json"], path / "state.json")
    if not isinstance(meta, dict):
        raise CheckpointCorruptError(f"{path / 'state.json'} must hold a JSON object")
    try:
        config = data["config.toml"].decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointCorruptError(f"{path / 'config.toml'} is not UTF-8 text") from None
    if _sharded(manifest):
        shards = ShardSet(path, manifest, opened_dir)
        shards.preload({n: b for n, b in data.items() if n not in SHARDED_FILES})
        model, optimizer, ema = split_tensors(shards)
        if not lazy:
            model, optimizer, ema = _whole(model), {p: _whole(s) for p, s in optimizer.items()}, \
                None if ema is None else _whole(ema)
            shards.release()
        return Checkpoint(path, manifest, TrainingState(manifest["update"], model, optimizer, rng, meta, config, ema))
    model = io.decode_tensors(data["model.safetensors"], path / "model.safetensors")
    optimizer = _split_optimizer(io.decode_tensors(data["optimizer.safetensors"], path / "optimizer.safetensors"),
                                 path / "optimizer.safetensors")
    ema = (_strip_prefix(io.decode_tensors(data["ema.safetensors"], path / "ema.safetensors"), "ema/",
                         path / "ema.safetensors") if "ema.safetensors" in data else None)
    return Checkpoint(path, manifest, TrainingState(manifest["update"], model, optimizer, rng, meta, config, ema))


def _whole(tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in tensors.items()}


def release(checkpoint: Checkpoint) -> None:
    """Forget the tensor files a lazily loaded sharded checkpoint has read so far (its memory)."""
    for value in checkpoint.state.model.values():
        if hasattr(value, "shards"):
            value.shards.release()
            return


def whole(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint with every tensor whole (a lazily loaded sharded one's slices assembled)."""
    s = checkpoint.state
    state = s._replace(model=_whole(s.model), optimizer={p: _whole(e) for p, e in (s.optimizer or {}).items()},
                       ema=None if s.ema is None else _whole(s.ema))
    return checkpoint._replace(state=state)
