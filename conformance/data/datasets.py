"""The built-in data sets as NumPy arrays, split into train and validation, checked once on the host.

    ds = load_dataset(spec, seed=0, block_size=64)
    ds.info        # DataInfo: task, shapes, class count or vocabulary, sizes, sha256 fingerprint
    ds.train.take(np.array([3, 1]))   # -> {"x": ..., "y": ...} for those samples

Every split is conformance.data.sources.MapData (len, take, fingerprint): the protocol data brought
by a user implements too. Floating inputs are float64 (trainers cast to their compute dtype);
class labels and tokens are int64. Token shards: conformance.data.tokens; .npy / .npz files:
conformance.data.arrays; data passed to train(): conformance.data.user.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import importlib.resources
import io
from pathlib import Path

import numpy as np

from conformance.config.data import DataSpec
from conformance.data.sampling import fingerprint, stream
from conformance.data.splits import (
    ArraySplit,
    DataInfo,
    Dataset,
    Task,
    TokenSplit,
    check_split,
    n_validation,
    random_split,
)
from conformance.errors import ConfigError, InputError
from conformance.files import read_regular

DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
BLOB_FEATURES, BLOB_INFORMATIVE = 20, 5  # x ~ N(0, 1)^20, label = sum(x[:5]) > 0: 5 informative features of 20
MAX_TEXT_BYTES = 1 << 30  # beyond 1 GiB a character-level corpus wants a real tokenizer pipeline
DEFAULT_CORPUS = "pydoc_data.topics"
# data.corpus: the texts shipped with twinstep or Python (provenance: conformance/data/assets/README.md)
TINYSHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  # of the text

def linear_regression(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Seed 001 §3.2: x = linspace(-1, 1, n) as a column, y = 3x + 2."""
    x = np.linspace(-1.0, 1.0, n).reshape(-1, 1)
    return x, 3.0 * x + 2.0


def binary_blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seed 000: x ~ N(0, 1)^20, label = 1 if x[:5].sum() > 0 else 0."""
    x = stream(seed, "binary_blobs").standard_normal((n, BLOB_FEATURES))
    return x, (x[:, :BLOB_INFORMATIVE].sum(axis=1) > 0).astype(np.int64)


def digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """The vendored 8×8 digits (scikit-learn's copy of UCI optdigits' test set): pixel counts
    0..16 as float64 (1797, 64) and labels 0..9 as int64 (1797,)."""
    raw = importlib.resources.files("conformance.data").joinpath("assets/digits.csv.gz").read_bytes()
    if hashlib.sha256(raw).hexdigest() != DIGITS_SHA256:
        raise InputError("conformance/data/assets/digits.csv.gz does not match its recorded sha256; reinstall twinstep")
    table = np.loadtxt(io.BytesIO(gzip.decompress(raw)), delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(np.int64)


def default_corpus() -> str:
    """Python's interactive help text (pydoc_data.topics, part of every CPython install): the
    topics sorted by name, joined by newlines (about 465k characters on CPython 3.11)."""
    try:
        topics = importlib.import_module(DEFAULT_CORPUS).topics
    except ImportError:
        raise InputError(
            f"data.path: the built-in corpus ({DEFAULT_CORPUS}) is missing from this Python; name a UTF-8 file"
        ) from None
    return "\n".join(topics[key] for key in sorted(topics))


def builtin_corpus(name: str) -> str:
    """The text of a built-in corpus (data.corpus): "python_help" (default_corpus) or
    "tinyshakespeare" (karpathy/char-rnn's 1,115,394 characters of Shakespeare, nanoGPT's
    shakespeare_char data), checked against its recorded sha256."""
    if name == "python_help":
        return default_corpus()
    if name != "tinyshakespeare":
        raise ConfigError(f"data.corpus: no built-in corpus {name!r}; choose python_help or tinyshakespeare")
    packed = importlib.resources.files("conformance.data").joinpath("assets/tinyshakespeare.txt.gz").read_bytes()
    raw = gzip.decompress(packed)
    if hashlib.sha256(raw).hexdigest() != TINYSHAKESPEARE_SHA256:
        raise InputError("conformance/data/assets/tinyshakespeare.txt.gz does not match its recorded sha256; "
                         "reinstall twinstep")
    return raw.decode("utf-8")


def read_corpus(path: str) -> str:
    """A UTF-8 text file, read whole; a missing, unreadable, huge or non-UTF-8 file is one error."""
    p = Path(path).expanduser()
    # through conformance.files: a FIFO or a device is refused at once, a huge file before reading
    raw = read_regular(p, MAX_TEXT_BYTES, what="text file", error=ConfigError, shown=f"data.path: {p}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = raw[exc.start]
        raise InputError(f"data.path: {p} is not UTF-8 text (byte {byte:#04x} at offset {exc.start})") from None


def _array_dataset(name: str, task: Task, x: np.ndarray, y: np.ndarray, n_val: int,
                   split_seed: int | None, n_classes: int | None) -> Dataset:
    n = x.shape[0]
    if split_seed is None:  # no seed: the first samples train, the last n_val validate (a fixed split)
        tr, va = np.arange(n - n_val), np.arange(n - n_val, n)
    else:
        tr, va = random_split(n, n_val, split_seed)
    train, val = ArraySplit(x[tr], y[tr]), ArraySplit(x[va], y[va])
    n_out = n_classes if n_classes is not None else int(y.shape[1])
    for label, part in (("train", train), ("validation", val)):
        check_split(name, label, part.x, part.y, task, n_out)
    info = DataInfo(name, task, int(x.shape[1]), n_out, n_classes, None, None, len(train), len(val),
                    fingerprint(train.x, train.y, val.x, val.y, label=name))
    return Dataset(train, val, info)


def _windows(n_tokens: int, block_size: int, stride: int) -> np.ndarray:
    if n_tokens < block_size + 1:
        return np.zeros(0, np.int64)
    return np.arange(0, n_tokens - block_size, stride, dtype=np.int64)


def _text_dataset(spec: DataSpec, block_size: int) -> Dataset:
    text = read_corpus(spec.path) if spec.path is not None else builtin_corpus(spec.corpus or "python_help")
    vocab = tuple(sorted(set(text)))
    lookup = {ch: i for i, ch in enumerate(vocab)}
    tokens = np.fromiter((lookup[ch] for ch in text), dtype=np.int64, count=len(text))
    n_val = n_validation(len(tokens), spec.val_fraction or 0.0)
    train_tokens, val_tokens = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    stride = spec.stride or block_size
    train = TokenSplit(train_tokens, _windows(len(train_tokens), block_size, stride), block_size)
    val = TokenSplit(val_tokens, _windows(len(val_tokens), block_size, block_size), block_size)
    source = spec.path or (f"the built-in corpus {spec.corpus}" if spec.corpus else DEFAULT_CORPUS)
    if len(train) == 0:
        raise InputError(
            f"data.block_size: the training part of {source} has {len(train_tokens)} characters, "
            f"too few for one window of {block_size} + 1"
        )
    if n_val and len(val) == 0:
        raise InputError(
            f"data.val_fraction: the validation part of {source} has {len(val_tokens)} characters, "
            f"too few for one window of {block_size} + 1; raise val_fraction or set it to 0"
        )
    info = DataInfo("text", "language_model", None, len(vocab), None, vocab, block_size, len(train), len(val),
                    fingerprint(tokens, np.frombuffer("".join(vocab).encode("utf-32-le"), np.uint32),
                                label=f"text:{block_size}:{stride}:{n_val}"))
    return Dataset(train, val, info)


def load_dataset(spec: DataSpec, seed: int, block_size: int | None = None, vocab_size: int | None = None) -> Dataset:
    """Load and split the data set `spec` names. `seed` (data.seed, else run.seed) draws synthetic
    data and random splits; `block_size` is the text window (data.block_size, else model.block_size);
    `vocab_size` bounds the tokens of token shards (model.vocab_size; None: unchecked)."""
    fraction = spec.val_fraction or 0.0
    if spec.name == "user":
        raise ConfigError("data.name = 'user' is the data passed to train(..., data=...) in Python; name a data "
                          "set (or omit [data] name and pass the data)")
    if spec.name == "tokens":
        from conformance.data.tokens import load_tokens

        if block_size is None:
            raise ConfigError("data.block_size is required for token shards (or model.block_size)")
        return load_tokens(spec, block_size, vocab_size)
    if spec.name == "arrays":
        from conformance.data.arrays import load_arrays

        return load_arrays(spec, seed)
    if spec.name == "linear_regression":
        n = spec.n_samples or 64
        x, y = linear_regression(n)
        ds = _array_dataset("linear_regression", "regression", x, y, n_validation(n, fraction), seed, None)
    elif spec.name == "binary_blobs":
        n = spec.n_samples or 5120
        x, y = binary_blobs(n, seed)
        ds = _array_dataset("binary_blobs", "classification", x, y, n_validation(n, fraction), None, 2)
    elif spec.name == "digits":
        x, y = digits_raw()
        ds = _array_dataset("digits", "classification", x / 16.0, y, n_validation(len(y), fraction), seed, 10)
    else:
        if block_size is None:
            raise ConfigError("data.block_size is required for the text data set (or model.block_size)")
        return _text_dataset(spec, block_size)
    if len(ds.train) == 0:
        raise ConfigError(f"data.val_fraction = {fraction} leaves no training samples out of {ds.info.n_val}")
    return ds
