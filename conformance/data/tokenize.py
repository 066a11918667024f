"""Text files → token shards in the llm.c format (`twinstep data tokenize`).

    summary = tokenize(["a.txt", "b.txt"], "shards", tokenizer="bytes", val_fraction=0.1)

Tokenizers: "bytes" (the UTF-8 bytes of the text, vocabulary 256, nothing to install) or the path
of a Hugging Face `tokenizer.json` (the `tokenizers` package: `pip install twinstep[tokenizers]`;
vocabularies up to 65536, as the shards hold uint16; text is encoded a line at a time, each line
keeping its newline, without special tokens). Each file's last `val_fraction` of tokens goes to the
validation shards, the rest to the training shards, in the order of the files; shards hold at most
`shard_tokens` tokens and are named train_000000.bin, ..., val_000000.bin, ... Each shard is
written atomically (conformance.data.shards.ShardWriter), and so is `tokenizer.json` beside them
(the byte tokenizer as a Hugging Face tokenizer.json, or a copy of the one given), which `twinstep
export` picks up for a run on these shards. A file with a NUL byte in its first 64 KiB is refused
as binary (git's rule), before anything is written. Bytes are streamed in chunks; a
tokenizer.json keeps one file's tokens in memory (2 bytes a token) to split off its validation part.
"""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from conformance.data.opening import open_data
from conformance.data.shards import MAX_VOCAB, ShardWriter
from conformance.errors import ConfigError, InputError, UnsupportedError
from conformance.files import read_regular, write_bytes_atomic

CHUNK = 16 << 20  # bytes read at a time
LINES = 4096  # lines encoded per batch with a tokenizer.json
MAX_TOKENIZER_BYTES = 1 << 30  # a tokenizer.json is read whole (the largest vocabularies take a few hundred MiB)
BINARY_PROBE = 64 << 10  # bytes of each input checked for a NUL


class Encoder(NamedTuple):
    """A tokenizer: its name, vocabulary size, `chunks(path, advance)`: the file's tokens, a chunk at a
    time (advance(n) reports n bytes read), and its tokenizer.json (written beside the shards)."""

    name: str
    vocab_size: int
    chunks: Callable[[Path, Callable[[int], None]], Iterator[np.ndarray]]
    tokenizer_json: bytes


def _byte_chunks(path: Path, advance: Callable[[int], None]) -> Iterator[np.ndarray]:
    f, _ = open_data(path, str(path))
    with f:
        while block := f.read(CHUNK):
            advance(len(block))
            yield np.frombuffer(block, np.uint8)


def _hf(path: str) -> Encoder:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UnsupportedError("--tokenizer PATH/tokenizer.json needs the tokenizers package: "
                               "pip install 'twinstep[tokenizers]'") from None
    text = read_regular(path, MAX_TOKENIZER_BYTES, what="tokenizer.json", error=InputError, shown=f"--tokenizer: {path}")
    try:
        tok = Tokenizer.from_str(text.decode("utf-8", errors="replace"))
    except Exception as exc:  # the Rust side raises plain Exceptions for unreadable files
        raise InputError(f"--tokenizer: cannot read {path} as a Hugging Face tokenizer.json ({exc})") from None
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab > MAX_VOCAB:
        raise InputError(f"--tokenizer: {path} has a vocabulary of {vocab}; token shards hold uint16 tokens "
                         f"(at most {MAX_VOCAB})")

    def chunks(file: Path, advance: Callable[[int], None]) -> Iterator[np.ndarray]:
        raw, _ = open_data(file, str(file))
        with io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
            lines: list[str] = []
            for line in f:
                lines.append(line)
                if len(lines) == LINES:
                    yield _encode(tok, lines, advance)
                    lines = []
            if lines:
                yield _encode(tok, lines, advance)

    return Encoder(path, vocab, chunks, text)


def _encode(tok: Any, lines: list[str], advance: Callable[[int], None]) -> np.ndarray:
    advance(sum(len(s.encode("utf-8")) for s in lines))
    ids = [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    return np.fromiter((i for row in ids for i in row), np.int64)


def encoder(name: str) -> Encoder:
    """"bytes", or the path of a tokenizer.json."""
    if name == "bytes":
        from conformance.export.vocab import byte_vocabulary, tokenizer_json

        return Encoder("bytes", 256, _byte_chunks, tokenizer_json(byte_vocabulary()))
    if not Path(name).exists():
        raise ConfigError(f"--tokenizer must be 'bytes' or the path of a tokenizer.json; {name} is not a file")
    return _hf(name)


class _Shards:
    """Shards of one split, rolled over every `limit` tokens."""

    def __init__(self, out: Path, split: str, limit: int) -> None:
        self.out, self.split, self.limit = out, split, limit
        self.writer: ShardWriter | None = None
        self.paths: list[Path] = []
        self.tokens = 0

    def write(self, tokens: np.ndarray) -> None:
        while tokens.size:
            if self.writer is None:
                self.writer = ShardWriter(self.out / f"{self.split}_{len(self.paths):06d}.bin")
            room = self.limit - self.writer.count
            self.writer.write(tokens[:room])
            self.tokens += min(room, tokens.size)
            tokens = tokens[room:]
            if self.writer.count == self.limit:
                self.paths.append(self.writer.close())
                self.writer = None

    def close(self) -> None:
        if self.writer is not None and self.writer.count:
            self.paths.append(self.writer.close())
        elif self.writer is not None:
            self.writer.abort()
        self.writer = None

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


class Summary(NamedTuple):
    vocab_size: int
    train_tokens: int
    val_tokens: int
    train_shards: list[Path]
    val_shards: list[Path]
    tokenizer: Path


def _check_inputs(files: Sequence[str], out: Path, val_fraction: float, shard_tokens: int) -> list[Path]:
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in [0, 1); received {val_fraction}")
    if shard_tokens < 1:
        raise ConfigError(f"--shard-tokens must be at least 1; received {shard_tokens}")
    paths = [Path(f).expanduser() for f in files]
    for p in paths:  # regular files only: a FIFO or a device is refused now, not read forever later
        f, _ = open_data(p, str(p), error=ConfigError)
        with f:
            head = f.read(BINARY_PROBE)
        if b"\0" in head:  # an executable, an image, a compressed file: not text
            raise InputError(f"{p} looks binary (a NUL byte at offset {head.index(0)}); data tokenize reads "
                             f"text files")
    if out.exists() and (any(out.glob("train_*.bin")) or any(out.glob("val_*.bin"))):
        raise ConfigError(f"-o {out} already holds token shards; choose another directory (nothing was overwritten)")
    return paths


def tokenize(files: Sequence[str], out_dir: str | Path, tokenizer: str = "bytes", val_fraction: float = 0.0,
             shard_tokens: int = 100_000_000, progress: bool | None = None) -> Summary:
    """Write the shards (see the module docstring). `progress`: a bar on stderr (None: on a terminal)."""
    out = Path(out_dir).expanduser()
    paths = _check_inputs(files, out, val_fraction, shard_tokens)
    enc = encoder(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=sum(p.stat().st_size for p in paths), unit="B", unit_scale=True, disable=not show,
               desc="tokenize", file=sys.stderr)
    train, val = _Shards(out, "train", shard_tokens), _Shards(out, "val", shard_tokens)
    try:
        for p in paths:
            _one_file(enc, p, val_fraction, train, val, bar.update)
        train.close()
        val.close()
        write_bytes_atomic(out / "tokenizer.json", enc.tokenizer_json)
    except BaseException:
        train.abort()
        val.abort()
        raise
    finally:
        bar.close()
    return Summary(enc.vocab_size, train.tokens, val.tokens, train.paths, val.paths, out / "tokenizer.json")


def _one_file(enc: Encoder, path: Path, fraction: float, train: _Shards, val: _Shards,
              advance: Callable[[int], None]) -> None:
    if enc.name == "bytes":  # one token a byte: the split point is known before reading
        n = path.stat().st_size
        cut = n - (math.floor(n * fraction + 0.5) if fraction > 0 else 0)
        seen = 0
        for chunk in enc.chunks(path, advance):
            head = max(0, min(chunk.size, cut - seen))
            train.write(chunk[:head])
            val.write(chunk[head:])
            seen += chunk.size
        return
    parts = list(enc.chunks(path, advance))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    cut = tokens.size - (math.floor(tokens.size * fraction + 0.5) if fraction > 0 else 0)
    train.write(tokens[:cut])
    val.write(tokens[cut:])
