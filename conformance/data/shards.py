"""Token shards in the llm.c / modded-nanogpt binary format: reading, checking, writing.

A shard is a header of 256 little-endian int32 — header[0] = 20240520 (magic), header[1] = 1
(version: uint16 tokens), header[2] = the token count — followed by the tokens as little-endian
uint16; the file has exactly 1024 + 2·count bytes (reference/wave2.md, "Token shards").

    header = read_header(path)                       # ShardHeader, or InputError naming the file
    tokens = open_tokens(path, header)               # np.memmap, read-only: never read whole
    with ShardWriter(path) as w: w.write(tokens)     # atomic: a temporary file renamed when complete

Every problem is one line naming the file: a wrong magic, version or size, a token out of range
(with its token index and byte offset).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from conformance.data.opening import open_data
from conformance.errors import InputError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MAX_VOCAB = 1 << 16  # uint16 tokens


class ShardHeader(NamedTuple):
    """A checked header: the file, its token count and its raw 256 ints (for the fingerprint)."""

    path: Path
    count: int
    raw: bytes


def read_header(path: str | Path, field: str = "data.path") -> ShardHeader:
    """Read and check a shard's header and size (magic, version, 1024 + 2·count bytes)."""
    p = Path(path)
    f, size = open_data(p, f"{field}: {p}")  # a FIFO or a device is refused here, unread
    try:
        with f:
            raw = f.read(HEADER_BYTES)
    except OSError as exc:
        raise InputError(f"{field}: {p}: cannot read ({exc.strerror})") from None
    if len(raw) < HEADER_BYTES:
        raise InputError(f"{field}: {p}: the file has {size} bytes, fewer than the {HEADER_BYTES}-byte header of a "
                         f"token shard")
    header = np.frombuffer(raw, "<i4")
    if int(header[0]) != MAGIC:
        raise InputError(f"{field}: {p}: header magic is {int(header[0])}, not {MAGIC} (not an llm.c token shard)")
    if int(header[1]) != VERSION:
        raise InputError(f"{field}: {p}: header version is {int(header[1])}, not {VERSION} (uint16 tokens); "
                         f"other versions are not supported")
    count = int(header[2])
    if count < 0 or size != HEADER_BYTES + 2 * count:
        raise InputError(f"{field}: {p}: the file has {size} bytes, but its header says {count} tokens "
                         f"({HEADER_BYTES + 2 * max(count, 0)} bytes); truncated, or not a token shard")
    return ShardHeader(p, count, raw)


def open_tokens(header: ShardHeader) -> np.ndarray:
    """The shard's tokens as a read-only uint16 memory map (empty shards: an empty array)."""
    if header.count == 0:
        return np.zeros(0, TOKEN_DTYPE)
    f, _ = open_data(header.path, str(header.path))
    with f:  # the map outlives the file object (mmap holds its own reference)
        return np.memmap(f, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(header.count,))


def scan(header: ShardHeader, digest: Any, vocab_size: int | None, field: str = "data.path",
         chunk_tokens: int = 1 << 20) -> int:
    """Feed the tokens to `digest` and check them against `vocab_size` (None: no bound), reading
    the file in chunks (plain reads: the scan maps nothing into memory). Returns the largest token
    (-1 for an empty shard); a token >= vocab_size is an InputError with its index and byte offset."""
    top = -1
    buf = np.empty(chunk_tokens, TOKEN_DTYPE)
    f, _ = open_data(header.path, f"{field}: {header.path}")
    with f:
        f.seek(HEADER_BYTES)
        done = 0
        while done < header.count:
            n = min(chunk_tokens, header.count - done)
            view = memoryview(buf)[:n].cast("B")
            got = f.readinto(view)
            if got != 2 * n:
                raise InputError(f"{field}: {header.path} ended after {done + got // 2} of {header.count} tokens "
                                 f"(changed while reading?)")
            part = buf[:n]
            digest.update(part.tobytes())
            top = max(top, int(part.max()))
            if vocab_size is not None and top >= vocab_size:
                i = done + int(np.argmax(part >= vocab_size))
                raise InputError(f"{field}: {header.path}: token {int(buf[i - done])} at token index {i} "
                                 f"(byte offset {HEADER_BYTES + 2 * i}) is out of range 0..{vocab_size - 1} "
                                 f"(model.vocab_size = {vocab_size})")
            done += n
    return top


class ShardWriter:
    """Write one shard: tokens are appended to a temporary file beside `path`; close() writes the
    header with the final count, fsyncs and renames it into place (a reader never sees half a
    shard). Used as a context manager; an exception leaves nothing behind."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        self.tmp = Path(tmp)
        self.file = os.fdopen(fd, "wb")
        self.file.write(b"\0" * HEADER_BYTES)
        self.count = 0

    def write(self, tokens: np.ndarray) -> None:
        t = np.asarray(tokens)
        if t.size and (int(t.min()) < 0 or int(t.max()) >= MAX_VOCAB):
            raise InputError(f"{self.path}: token {int(t.max()) if int(t.max()) >= MAX_VOCAB else int(t.min())} "
                             f"does not fit a uint16 shard (0..{MAX_VOCAB - 1})")
        self.file.write(t.astype(TOKEN_DTYPE).tobytes())
        self.count += int(t.size)

    def close(self) -> Path:
        header = np.zeros(HEADER_INTS, "<i4")
        header[:3] = (MAGIC, VERSION, self.count)
        self.file.seek(0)
        self.file.write(header.tobytes())
        self.file.flush()
        os.fchmod(self.file.fileno(), 0o644)  # data, not a secret (mkstemp made it 0o600)
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
