"""The checkpoint manifest, verified to the last field: a strict schema and a hash of itself.

    data = encode_manifest(update=..., files=..., ...)     # canonical JSON bytes, self-hash included
    manifest = parse_manifest(data, path)                   # or CheckpointCorruptError / CheckpointRejected

`manifest.json` lists every other file's size and sha256, so it is what vouches for a checkpoint;
nothing vouched for the manifest itself before format 2 (1345 of 8344 single-bit flips of a
manifest were accepted). Format 2 covers it completely:

- `manifest_sha256` is the sha256 of the canonical encoding (conformance.checkpoint.files.encode_json:
  sorted keys, indent 1, finite numbers) of every other field, and the file must be byte-identical
  to the canonical encoding of what it parses to. Any change of any byte is therefore refused:
  either the JSON breaks, or it is no longer canonical, or the hash no longer matches.
- A strict schema: exactly the keys below, each of its type and range, `files` naming exactly
  the checkpoint's files, `config_sha256` equal to the config file's entry, `update` equal to the
  directory's number. State-level cross-checks (counters, world size against the RNG states, the
  validation loss against state.json) are conformance.run.validate's.

Format 1 manifests (written before the self-hash existed) are still read, under the same strict
schema without `manifest_sha256`: a checkpoint written by an older twinstep stays resumable. A
whole-tensor save (one process, DDP) writes format 2.

Format 3 is the sharded layout (FSDP: every rank writes its own slices, conformance.checkpoint.shards):
format 2's keys plus `tensors`, a table of every tensor ("model/<name>", "optimizer/<param>/<state>",
"ema/<name>") with its global `shape`, `dtype` and `pieces` [{file, start, stop}], each piece the
box [start, stop) of the global tensor that file holds. Its files are rng.safetensors, state.json and
config.toml (rank 0), `rank-<5 digits>.safetensors` for every rank 0..world_size-1 and, when some
tensors are not sharded, `replicated.safetensors` (rank 0). The pieces of every tensor must tile its
shape exactly (no gap, no overlap) and name only listed files: checked here, before any tensor is read.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from conformance.checkpoint import files as io
from conformance.checkpoint.shards import check_tiling
from conformance.errors import CheckpointCorruptError, CheckpointRejected

FORMAT = "twinstep-checkpoint"
FORMAT_VERSION = 2  # what a whole-tensor save writes
SHARDED_VERSION = 3  # what a sharded save writes (the `tensors` table)
READABLE_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20  # a sharded manifest lists every piece of every tensor
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json", "config.toml")
OPTIONAL_FILES = ("ema.safetensors",)  # the weights' EMA, once a run with [ema] has started it
SHARDED_FILES = ("rng.safetensors", "state.json", "config.toml")
REPLICATED = "replicated.safetensors"
RANK_FILE = re.compile(r"^rank-(\d{5})\.safetensors$")
TEXT_FILES = ("state.json", "config.toml")
SELF_HASH = "manifest_sha256"
KEYS_V1 = frozenset({"format", "format_version", "update", "created_unix", "world_size", "val_loss",
                     "config_sha256", "versions", "files"})
KEYS = {1: KEYS_V1, 2: KEYS_V1 | {SELF_HASH}, 3: KEYS_V1 | {SELF_HASH, "tensors"}}
TENSOR_KEY = re.compile(r"^(model|ema)/[^/]+$|^optimizer/[^/]+/[^/]+$")
MAX_DIMS = 32
INT64_MAX = 2**63 - 1
MAX_FILE_BYTES = 1 << 44  # 16 TiB: more than any tensor file of ours, less than a wrapped size
MAX_WORLD = 1 << 20
MAX_CREATED = 1 << 36  # seconds since 1970: the year 4147
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_VERSION_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
STEP_RE = re.compile(r"^step-(\d{8,})$")


def _hash(fields: dict[str, Any]) -> str:
    return io.sha256_hex(io.encode_json({k: v for k, v in fields.items() if k != SELF_HASH}, MANIFEST))


def rank_file(rank: int) -> str:
    """The file rank `rank` writes its slices to in a sharded checkpoint: rank-00001.safetensors."""
    return f"rank-{int(rank):05d}.safetensors"


def encode_manifest(*, update: int, files: dict[str, dict[str, Any]], created_unix: float, world_size: int,
                    val_loss: float | None, versions: dict[str, str],
                    tensors: dict[str, dict[str, Any]] | None = None) -> bytes:
    """The canonical bytes of a manifest, its own hash included: format 2, or format 3 (sharded)
    when `tensors` (the table of pieces) is given."""
    fields: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION if tensors is None else SHARDED_VERSION,
        "update": update,
        "created_unix": created_unix,
        "world_size": world_size,
        "val_loss": None if val_loss is None or not math.isfinite(val_loss) else float(val_loss),
        "config_sha256": files["config.toml"]["sha256"],
        "versions": {str(k): str(v)[:256] for k, v in versions.items()},
        "files": files,
    }
    if tensors is not None:
        fields["tensors"] = tensors
    fields[SELF_HASH] = _hash(fields)
    return io.encode_json(fields, MANIFEST)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(where: Path, field: str, want: str, value: Any) -> CheckpointCorruptError:
    text = repr(value)
    return CheckpointCorruptError(f"{where}: {field} must be {want}; received {text[:60]}")


def parse_manifest(data: bytes, where: Path, directory_name: str | None = None) -> dict[str, Any]:
    """Parse and check manifest bytes completely (see the module docstring); `directory_name`: the
    checkpoint directory's name, whose number `update` must equal."""
    manifest = io.decode_json(data, where)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointRejected(f"{where} is not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if not _int(version) or version < 1:
        raise _bad(where, "format_version", "a positive integer", version)
    if version not in READABLE_VERSIONS:
        raise CheckpointRejected(
            f"{where}: format_version {version} is newer than this twinstep reads (up to {FORMAT_VERSION}); "
            f"upgrade twinstep to resume from it")
    if version >= 2:
        if manifest.get(SELF_HASH) != _hash(manifest):
            raise CheckpointCorruptError(
                f"{where}: {SELF_HASH} does not match the manifest's content (the manifest changed after it "
                f"was written)")
    if data != io.encode_json(manifest, MANIFEST):
        raise CheckpointCorruptError(f"{where} is not in its canonical form (the manifest changed after it was "
                                     f"written)")
    keys = KEYS[version]
    unknown = sorted(set(manifest) - keys)
    if unknown:
        raise CheckpointCorruptError(f"{where}: unknown key {unknown[0]!r} (a format-{version} manifest holds "
                                     f"{', '.join(sorted(keys))})")
    missing = sorted(keys - set(manifest))
    if missing:
        raise CheckpointCorruptError(f"{where}: key {missing[0]!r} is missing")
    _check_fields(manifest, where, directory_name)
    return manifest


def _check_fields(m: dict[str, Any], where: Path, directory_name: str | None) -> None:
    update = m["update"]
    if not _int(update) or not 0 <= update <= INT64_MAX:
        raise _bad(where, "update", "an integer in [0, 2^63)", update)
    match = STEP_RE.match(directory_name or "")
    if match and int(match.group(1)) != update:
        raise CheckpointRejected(f"{where} says update {update}, but the directory is {directory_name}")
    created = m["created_unix"]
    if not (_int(created) or isinstance(created, float)) or not 0 <= created < MAX_CREATED:
        raise _bad(where, "created_unix", "seconds since 1970 (a number in [0, 2^36))", created)
    world = m["world_size"]
    if not _int(world) or not 1 <= world <= MAX_WORLD:
        raise _bad(where, "world_size", f"an integer in [1, {MAX_WORLD}]", world)
    loss = m["val_loss"]
    if loss is not None and not (isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss)):
        raise _bad(where, "val_loss", "a finite number or null", loss)
    versions = m["versions"]
    if not isinstance(versions, dict) or len(versions) > 64:
        raise _bad(where, "versions", "a table of at most 64 names", versions)
    for key, value in versions.items():
        if not _VERSION_KEY.match(key) or not isinstance(value, str) or len(value) > 256:
            raise _bad(where, f"versions.{key}", "a version string of at most 256 characters", value)
    sharded = m["format_version"] >= SHARDED_VERSION
    _check_files(m["files"], where, world if sharded else None)
    if m["config_sha256"] != m["files"]["config.toml"]["sha256"]:
        raise CheckpointCorruptError(f"{where}: config_sha256 differs from files.config.toml.sha256")
    if sharded:
        _check_tensors(m["tensors"], m["files"], where)


def _allowed(name: str, world: int | None) -> bool:
    if world is None:
        return name in FILES or name in OPTIONAL_FILES
    match = RANK_FILE.match(name)
    return name in SHARDED_FILES or name == REPLICATED or (match is not None and int(match.group(1)) < world)


def _check_files(files: Any, where: Path, world: int | None = None) -> None:
    """`world`: None for the whole layout, else the sharded layout's world size."""
    if not isinstance(files, dict):
        raise _bad(where, "files", "a table of file name -> size and sha256", files)
    for name in files:
        if not _allowed(name, world):
            held = (f"exactly {', '.join(FILES)} and optionally {', '.join(OPTIONAL_FILES)}" if world is None else
                    ", ".join(SHARDED_FILES) + f", rank-00000 .. {rank_file(world - 1)} and {REPLICATED}")
            raise CheckpointRejected(f"{where} lists an unsafe or unknown file name {name!r} (a checkpoint holds "
                                     f"{held}; paths, '..' and absolute names are refused)")
    required = FILES if world is None else SHARDED_FILES + tuple(rank_file(r) for r in range(world))
    for name in required + tuple(n for n in files if n not in required):
        entry = files.get(name)
        if entry is None:
            if world is not None and RANK_FILE.match(name):
                raise CheckpointCorruptError(f"{where} does not list {name}: rank {int(name[5:10])}'s shard of a "
                                             f"{world}-rank checkpoint is missing")
            raise CheckpointCorruptError(f"{where} does not list {name}")
        if not isinstance(entry, dict) or set(entry) != {"size", "sha256"}:
            raise _bad(where, f"files.{name}", "a table of exactly size and sha256", entry)
        size, digest = entry["size"], entry["sha256"]
        limit = io.MAX_JSON_BYTES if name in TEXT_FILES else MAX_FILE_BYTES
        if not _int(size) or not 0 <= size <= limit:
            raise _bad(where, f"files.{name}.size", f"an integer in [0, {limit}]", size)
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise _bad(where, f"files.{name}.sha256", "64 lowercase hex digits", digest)


def _check_tensors(tensors: Any, files: dict[str, Any], where: Path) -> None:
    """The sharded layout's table: known names, a shape and dtype each, pieces in listed tensor
    files, inside the shape, tiling it exactly (conformance.checkpoint.shards.check_tiling)."""
    if not isinstance(tensors, dict):
        raise _bad(where, "tensors", "a table of tensor name -> shape, dtype and pieces", tensors)
    tensor_files = {n for n in files if n == REPLICATED or RANK_FILE.match(n)}
    for key, entry in tensors.items():
        field = f"tensors.{key}"
        if not isinstance(key, str) or not TENSOR_KEY.match(key):
            raise _bad(where, "tensors", "names model/<n>, ema/<n> or optimizer/<param>/<state>", key)
        if not isinstance(entry, dict) or set(entry) != {"shape", "dtype", "pieces"}:
            raise _bad(where, field, "a table of exactly shape, dtype and pieces", entry)
        shape = entry["shape"]
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(_int(n) and 0 <= n <= INT64_MAX for n in shape)):
            raise _bad(where, f"{field}.shape", f"a list of at most {MAX_DIMS} sizes", shape)
        if entry["dtype"] not in io.DTYPE_NAMES:
            raise _bad(where, f"{field}.dtype", "a NumPy dtype name a checkpoint holds", entry["dtype"])
        pieces = entry["pieces"]
        if not isinstance(pieces, list):
            raise _bad(where, f"{field}.pieces", "a list of {file, start, stop}", pieces)
        for i, piece in enumerate(pieces):
            pf = f"{field}.pieces[{i}]"
            if not isinstance(piece, dict) or set(piece) != {"file", "start", "stop"}:
                raise _bad(where, pf, "a table of exactly file, start and stop", piece)
            if piece["file"] not in tensor_files:
                raise CheckpointRejected(f"{where}: {pf}.file names {str(piece['file'])[:80]!r}, which is not a "
                                         f"tensor file listed in this checkpoint directory (paths, '..' and "
                                         f"absolute names are refused)")
            for side in ("start", "stop"):
                box = piece[side]
                if not isinstance(box, list) or len(box) != len(shape) or not all(_int(n) for n in box):
                    raise _bad(where, f"{pf}.{side}", f"a list of {len(shape)} integers", box)
        check_tiling(key, shape, [(p["file"], p["start"], p["stop"]) for p in pieces], where)
