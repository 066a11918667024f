"""Saving a sharded checkpoint (format 3, conformance.checkpoint.shards) from every rank at once.

    save_sharded(directory, state, pieces, rank=r, world_size=n, exchange=all_gather_bytes, ...)

Every rank calls it with its own pieces ({"model/w": (local array, global shape, start)}); nothing
is gathered to rank 0 but each rank's file table (names, sizes, sha256, boxes: a few hundred bytes
per tensor). The commit is the whole layout's, made collective (reliability.md §1: DCP's .metadata
and Orbax's commit file are the same idea):

1. rank 0 creates `.tmp-step-…-<uuid>` and every rank learns its name (one exchange);
2. every rank writes its rank-<r>.safetensors there (O_EXCL, fsync'ed); rank 0 also the
   replicated tensors, RNG states, state.json and config.toml;
3. every rank sends rank 0 what it wrote, or the error that stopped it (one exchange);
4. rank 0 writes manifest.json only when every rank's files are durable, fsyncs the directory and
   renames it into place (then retention), and tells every rank the outcome (one exchange).

A rank killed anywhere before 4 leaves a `.tmp-` directory without a manifest, which no resume
takes and the next run removes (format.prepare_directory); a failure on any rank is a
CheckpointError on every rank, with nothing committed. `exchange(bytes) -> [bytes of every rank]` is
the framework's all-gather (ref_torch._parallel.gather_bytes; ref_jax._parallel for JAX processes).
The directory must be one file system that every rank sees (one host, or a shared file system).
"""

from __future__ import annotations

import json
import math
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conformance.checkpoint import files as io
from conformance.checkpoint.format import (
    TrainingState,
    apply_retention,
    commit_step,
    library_versions,
    step_name,
)
from conformance.checkpoint.manifest import (
    MANIFEST,
    REPLICATED,
    encode_manifest,
    parse_manifest,
    rank_file,
)
from conformance.errors import CheckpointError
from conformance.events import Events, notify

Exchange = Callable[[bytes], list[bytes]]
# key -> (this rank's box as an array, the global shape, the box's start per dimension)
Pieces = Mapping[str, tuple[np.ndarray, Sequence[int], Sequence[int]]]


def save_sharded(directory: str | Path, state: TrainingState, pieces: Pieces, *, rank: int, world_size: int,
                 exchange: Exchange, versions: dict[str, Any] | None = None, val_loss: float | None = None,
                 keep_last: int | None = None, keep_best: bool = False, events: Events | None = None) -> Path:
    """Write the checkpoint after `state.update` updates as every rank's slices (see the module
    docstring); every rank calls it. `state`: rank 0's RNG tensors, meta and config (its model,
    optimizer and ema are ignored: the tensors are `pieces`). A piece whose box is its whole tensor
    is replicated: rank 0 writes it, other ranks drop it; empty boxes are skipped. Returns the path
    on every rank. `events`: every rank observes `after_first_file` (its shard is durable); rank 0
    the other stages (conformance.events.CHECKPOINT_STAGES)."""
    directory = Path(directory)
    final = directory / step_name(state.update)
    tmp_name = ""
    if rank == 0:
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=io.DIR_MODE)
            tmp_name = f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
            (directory / tmp_name).mkdir(mode=io.DIR_MODE)
        except OSError as exc:
            tmp_name = f"!{directory}: cannot save checkpoint {final.name} ({exc.strerror or exc})"
    tmp_name = exchange(tmp_name.encode("utf-8"))[0].decode("utf-8")
    if tmp_name.startswith("!"):
        raise CheckpointError(f"{tmp_name[1:]}; the checkpoints already saved are intact")
    tmp = directory / tmp_name
    report: dict[str, Any]
    try:
        report = {"ok": True, **_write_rank(tmp, state, pieces, rank, events)}
    except (CheckpointError, OSError) as exc:
        report = {"ok": False, "error": str(exc) if isinstance(exc, CheckpointError) else
                  f"{tmp}: rank {rank} cannot write its shard ({exc.strerror or exc})"}
    reports = [json.loads(b.decode("utf-8")) for b in exchange(json.dumps(report).encode("utf-8"))]
    outcome = ""
    if rank == 0:
        outcome = _commit_all(tmp, final, state, reports, world_size, versions, val_loss, events)
    outcome = exchange(outcome.encode("utf-8"))[0].decode("utf-8")
    if outcome:
        raise CheckpointError(outcome)
    if rank == 0:
        notify(events, "checkpoint", stage="after_rename")
        if keep_last is not None:
            apply_retention(directory, keep_last, keep_best, protect=final, events=events)
    return final


def _write_rank(tmp: Path, state: TrainingState, pieces: Pieces, rank: int, events: Events | None) -> dict[str, Any]:
    """Write this rank's files into `tmp`; return {"files": {name: size/sha256}, "tensors": {key:
    {shape, dtype, file, start, stop}}}."""
    own: dict[str, np.ndarray] = {}
    replicated: dict[str, np.ndarray] = {}
    table: dict[str, dict[str, Any]] = {}
    for key in sorted(pieces):
        arr, shape, start = pieces[key]
        arr = np.asarray(arr)
        shape, start = [int(n) for n in shape], [int(a) for a in start]
        stop = [a + int(n) for a, n in zip(start, arr.shape)]
        whole = list(arr.shape) == shape and not any(start)
        if (whole and rank != 0) or (not whole and math.prod(arr.shape) == 0):
            continue
        name = REPLICATED if whole else rank_file(rank)
        (replicated if whole else own)[key] = arr
        table[key] = {"shape": shape, "dtype": arr.dtype.name, "file": name, "start": start, "stop": stop}
    files: dict[str, Any] = {}
    files[rank_file(rank)] = io.write_tensors(tmp, rank_file(rank), own)  # streamed: no copy of the shard
    notify(events, "checkpoint", stage="after_first_file")
    if rank == 0:
        if replicated:
            files[REPLICATED] = io.write_tensors(tmp, REPLICATED, replicated)
        payload = {
            "rng.safetensors": io.encode_tensors({f"rng/{k}": v for k, v in (state.rng or {}).items()}, "rng"),
            "state.json": io.encode_json(state.meta or {}, "checkpoint meta"),
            "config.toml": state.config.encode("utf-8"),
        }
        for name, data in payload.items():
            files[name] = io.write_file(tmp, name, data)
            notify(events, "checkpoint", stage="during_files")
    return {"files": files, "tensors": table}


def _commit_all(tmp: Path, final: Path, state: TrainingState, reports: list[dict[str, Any]], world: int,
                versions: dict[str, Any] | None, val_loss: float | None, events: Events | None) -> str:
    """Rank 0: the manifest over every rank's report, then the atomic rename; '' or the error."""
    try:
        bad = next((r for r in reports if not r.get("ok")), None)
        if bad is not None:
            raise CheckpointError(bad["error"])
        files: dict[str, Any] = {}
        tensors: dict[str, dict[str, Any]] = {}
        for report in reports:
            files.update(report["files"])
            for key, e in report["tensors"].items():
                entry = tensors.setdefault(key, {"shape": e["shape"], "dtype": e["dtype"], "pieces": []})
                if entry["shape"] != e["shape"] or entry["dtype"] != e["dtype"]:
                    raise CheckpointError(f"{tmp}: the ranks disagree on the shape or dtype of {key}")
                entry["pieces"].append({"file": e["file"], "start": e["start"], "stop": e["stop"]})
        notify(events, "checkpoint", stage="before_manifest")
        manifest = encode_manifest(update=state.update, files=files, created_unix=time.time(), world_size=world,
                                   val_loss=val_loss, versions={**library_versions(), **(versions or {})},
                                   tensors=tensors)
        parse_manifest(manifest, tmp / MANIFEST, final.name)  # the reader's checks (tiling ...) before committing
        io.write_file(tmp, MANIFEST, manifest)
        io.fsync_dir(tmp)
        notify(events, "checkpoint", stage="after_manifest")
        commit_step(tmp, final)
        return ""
    except (CheckpointError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves nothing behind
        text = str(exc) if isinstance(exc, CheckpointError) else f"{final}: cannot commit ({exc.strerror or exc})"
        return f"{text}; the checkpoints already saved are intact"
