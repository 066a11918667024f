"""Low-level file handling for checkpoints: durable writes, refusing reads, safetensors without pickle.

Writes go to a new file (O_EXCL, owner-only 0o600), are flushed and fsync'ed. Reads open with
O_NOFOLLOW and O_NONBLOCK relative to the checkpoint directory's descriptor, check the file's type,
owner, mode and size on the open descriptor (no race with a swapped path; a FIFO is refused, never
waited on), read the bytes once, and hand those same bytes to the hash check and then the parser.
Tensors are safetensors (a JSON header and raw little-endian bytes: no code runs on load).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from conformance.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointRejected,
)
from conformance.files import fsync_dir, open_exclusive, open_regular, read_fd, write_all

FILE_MODE = 0o600
DIR_MODE = 0o700
MAX_JSON_BYTES = 64 << 20  # a state.json this big is not ours

# safetensors dtype -> NumPy dtype name; anything else in a header is refused (safetensors.numpy
# lacks BF16).
_NAMES: dict[str, str] = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
}
DTYPE_NAMES = frozenset(_NAMES.values())  # the NumPy dtype names a checkpoint may hold
CODES = {name: code for code, name in _NAMES.items()}  # NumPy dtype name -> safetensors dtype


def numpy_dtype(code: str) -> np.dtype | None:
    """The NumPy dtype of a safetensors dtype code, None for one a checkpoint cannot hold.
    bfloat16 is ml_dtypes', imported when a file holds one (the import costs a process ~0.7 s)."""
    name = _NAMES.get(code)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return None if name is None else np.dtype(name)


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def write_file(directory: Path, name: str, data: bytes) -> dict[str, Any]:
    """Create directory/name (it must not exist), write, fsync; return {"size", "sha256"}."""
    return _write_parts(directory / name, [data])


def _write_parts(path: Path, parts: Iterable[bytes | memoryview]) -> dict[str, Any]:
    # create (exclusively), write the parts in order, fsync; {"size", "sha256"} of what was written
    try:
        fd = open_exclusive(path, FILE_MODE)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot create ({exc.strerror})") from None
    digest = hashlib.sha256()
    size = 0
    try:
        for part in parts:
            view = memoryview(part)
            digest.update(view)
            size += len(view)
            write_all(fd, view)
        os.fsync(fd)
    except OSError as exc:
        raise CheckpointError(f"{path}: write failed ({exc.strerror})") from None
    finally:
        os.close(fd)
    return {"size": size, "sha256": digest.hexdigest()}


def check_stat(st: os.stat_result, path: Path, kind: str) -> None:
    """Refuse anything but a `kind` ("file" or "directory") owned by us and not group/world-writable."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "directory" else stat.S_ISREG(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointRejected(f"{path} is a symbolic link; checkpoints hold only regular files")
    if not is_kind:
        raise CheckpointRejected(f"{path} is not a regular {kind}")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise CheckpointRejected(f"{path} is owned by uid {st.st_uid}, not by this user ({os.geteuid()})")
    if st.st_mode & 0o022:
        raise CheckpointRejected(
            f"{path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}); "
            "refusing a file others could have changed"
        )


def read_file(path: Path, limit: int | None = None, dir_fd: int | None = None) -> bytes:
    """Read a whole checkpoint file: no link followed, never blocking (a FIFO or a device is refused
    at once, conformance.files), check_stat on the open descriptor, at most `limit` bytes (default:
    the size fstat reports). With `dir_fd` the file is opened relative to that directory
    descriptor (`path`'s last component), so no symbolic link on the way is followed."""
    target = path.name if dir_fd is not None else path
    fd, st = open_regular(target, follow=False, dir_fd=dir_fd, error=CheckpointRejected,
                          missing=CheckpointCorruptError, shown=path)
    try:
        check_stat(st, path, "file")
        return read_fd(fd, st, st.st_size if limit is None else limit, what="file of this checkpoint",
                       error=CheckpointRejected, shown=path)
    finally:
        os.close(fd)


def read_verified(directory: Path, name: str, size: int, digest: str, dir_fd: int | None = None) -> bytes:
    """The bytes of directory/name, after checking them against the manifest's size and sha256."""
    path = directory / name
    data = read_file(path, limit=size, dir_fd=dir_fd)
    if len(data) != size:
        raise CheckpointCorruptError(f"{path} has {len(data)} bytes; the manifest says {size} (truncated or altered)")
    if sha256_hex(data) != digest:
        raise CheckpointCorruptError(f"{path} fails its sha256 check (the file changed after it was written)")
    return data


def encode_tensors(tensors: dict[str, np.ndarray], what: str) -> bytes:
    """safetensors bytes for a {name: ndarray} dict (little-endian, C order, known dtypes only)."""
    clean: dict[str, np.ndarray] = {}
    for key, value in tensors.items():
        arr = np.asarray(value)
        if arr.dtype.name not in DTYPE_NAMES:
            raise CheckpointError(f"{what}: tensor {key!r} has dtype {arr.dtype}, which a checkpoint cannot hold")
        clean[key] = np.ascontiguousarray(arr).reshape(arr.shape)  # ascontiguousarray makes 0-d arrays 1-d
    try:
        return safetensors.numpy.save(clean)
    except Exception as exc:  # the Rust serializer raises its own types
        raise CheckpointError(f"{what}: cannot serialize tensors ({exc})") from None


def write_tensors(directory: Path, name: str, tensors: dict[str, np.ndarray], what: str | None = None) -> dict[str, Any]:
    """Create directory/name as a safetensors file streamed from the arrays themselves (no
    serialized copy in memory: a rank's shard is written with O(1) extra memory), fsync; return
    {"size", "sha256"}. The bytes are a valid safetensors file (8-byte header size, JSON header
    with data_offsets, the tensors' little-endian bytes in header order)."""
    arrays: dict[str, np.ndarray] = {}
    header: dict[str, Any] = {}
    offset = 0
    for key in sorted(tensors):
        arr = np.asarray(tensors[key])
        if arr.dtype.name not in CODES:
            raise CheckpointError(f"{what or name}: tensor {key!r} has dtype {arr.dtype}, which a checkpoint cannot "
                                  f"hold")
        arr = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False)).reshape(arr.shape)
        arrays[key] = arr
        header[key] = {"dtype": CODES[arr.dtype.name], "shape": list(arr.shape),
                       "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned, as safetensors writes it
    parts = [len(text).to_bytes(8, "little"), text] + [a.reshape(-1).view(np.uint8) for a in arrays.values()]
    return _write_parts(directory / name, parts)


def decode_tensors(data: bytes, path: Path) -> dict[str, np.ndarray]:
    """Parse safetensors bytes; any malformed header or unknown dtype is CheckpointCorruptError."""
    try:
        views = safetensors.deserialize(data)
    except Exception as exc:  # SafetensorError and friends: one error class for every parse failure
        raise CheckpointCorruptError(f"{path} is not a valid safetensors file ({exc})") from None
    out: dict[str, np.ndarray] = {}
    for key, view in views:
        dtype = numpy_dtype(view["dtype"])
        if dtype is None:
            raise CheckpointCorruptError(f"{path}: tensor {key!r} has unsupported dtype {view['dtype']}")
        try:
            out[key] = np.frombuffer(view["data"], dtype=dtype).reshape(view["shape"])
        except ValueError as exc:
            raise CheckpointCorruptError(f"{path}: tensor {key!r} is malformed ({exc})") from None
    return out


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def decode_json(data: bytes, path: Path) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no duplicate keys; else CheckpointCorruptError."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: "[[[[…" bombs
        raise CheckpointCorruptError(f"{path} is not valid JSON ({type(exc).__name__}: {exc})") from None


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON (arrays belong in tensors)")


def encode_json(value: Any, what: str) -> bytes:
    """Canonical JSON bytes (sorted keys, finite numbers only)."""
    try:
        return json.dumps(value, sort_keys=True, indent=1, allow_nan=False, default=_plain).encode("utf-8") + b"\n"
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{what}: cannot write as JSON ({exc})") from None


def save_tensors(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    """Write one safetensors file atomically: a temporary file beside it, fsync, rename, fsync dir."""
    path = Path(path)
    data = encode_tensors(tensors, str(path))
    path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    tmp = f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    write_file(path.parent, tmp, data)
    try:
        os.replace(path.parent / tmp, path)
    except OSError as exc:
        (path.parent / tmp).unlink(missing_ok=True)
        raise CheckpointError(f"{path}: cannot write ({exc.strerror})") from None
    fsync_dir(path.parent)


def load_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """Read a safetensors file (a regular file of ours, not group/world-writable) into NumPy."""
    path = Path(path)
    return decode_tensors(read_file(path), path)
