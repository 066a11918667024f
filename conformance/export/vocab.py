"""The run's vocabulary as tokenizer files transformers loads (`AutoTokenizer.from_pretrained(DIR)`).

A text run's vocabulary is the sorted characters of its corpus (docs/models.md, "Data"): token i is
the i-th character. It is rebuilt from the run's `[data]` and accepted only when the data's
fingerprint equals the one the checkpoint recorded (a changed or missing corpus would silently map
ids to other characters). A run on token shards uses the tokenizer.json `twinstep data tokenize`
wrote beside its training shards, when the shards' fingerprint is still the checkpoint's; else the
user names it: `bytes` (token = byte value, `twinstep data tokenize`'s default) or the
tokenizer.json the shards were made with (copied). Characters and bytes become a byte-pair-encoding tokenizer.json without
merges (each character, or each byte in GPT-2's byte-to-unicode spelling, is one token), with
decoders that give the text back unchanged.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from conformance.config import Config
from conformance.errors import ConfigError, InputError, TwinstepError, TwinstepWarning
from conformance.files import read_regular

MAX_TOKENIZER_BYTES = 256 << 20


class Vocabulary(NamedTuple):
    kind: str  # "chars", "bytes" or "tokenizer.json"
    size: int
    tokenizer: dict[str, Any]  # the tokenizer.json content
    chars: tuple[str, ...] | None = None
    source: str | None = None
    raw: bytes | None = None  # a named tokenizer.json's own bytes, copied unchanged


def _byte_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (bytes_to_unicode of openai/gpt-2's encoder.py)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _bpe(vocab: dict[str, int], pre: dict[str, Any] | None, decoder: dict[str, Any]) -> dict[str, Any]:
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": pre, "post_processor": None, "decoder": decoder,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": []}}


def char_vocabulary(chars: tuple[str, ...]) -> Vocabulary:
    """Token i = chars[i]; decoding concatenates (Fuse)."""
    return Vocabulary("chars", len(chars), _bpe({c: i for i, c in enumerate(chars)}, None, {"type": "Fuse"}), chars)


def byte_vocabulary() -> Vocabulary:
    """Token b = byte b of the UTF-8 text (GPT-2's byte-level pre-tokenizer, without its word split)."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return Vocabulary("bytes", 256, _bpe({c: b for b, c in _byte_unicode().items()}, level, dict(level)))


def file_vocabulary(path: str) -> Vocabulary:
    """A Hugging Face tokenizer.json, copied as it is."""
    data = read_regular(path, MAX_TOKENIZER_BYTES, what="tokenizer.json")
    try:
        content = json.loads(data.decode("utf-8"))
        vocab = content["model"]["vocab"]
        size = len(vocab) + len(content.get("added_tokens") or [])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        raise InputError(f"--tokenizer: {path} is not a Hugging Face tokenizer.json (no model.vocab)") from None
    return Vocabulary("tokenizer.json", size, content, source=str(Path(path).resolve()), raw=data)


def _text_chars(config: Config, recorded: str | None) -> tuple[str, ...] | None:
    from conformance.data.datasets import load_dataset

    spec = config.data
    seed = spec.seed if spec.seed is not None else config.run.seed
    try:
        info = load_dataset(spec, seed, spec.block_size or config.model.block_size).info
    except TwinstepError as exc:
        warnings.warn(f"the vocabulary is not recorded: the run's corpus cannot be read ({exc})", TwinstepWarning,
                      stacklevel=3)
        return None
    if recorded is not None and info.fingerprint != recorded:
        warnings.warn(f"the vocabulary is not recorded: the corpus {spec.path or 'pydoc_data.topics'} is not the one "
                      f"the run trained on (its data fingerprint differs)", TwinstepWarning, stacklevel=3)
        return None
    return info.vocab


def _beside_shards(config: Config, meta: dict[str, Any] | None) -> Vocabulary | None:
    """The tokenizer.json `twinstep data tokenize` wrote beside the run's training shards, when the
    shards are still the ones the run trained on (their fingerprint is the checkpoint's)."""
    from conformance.data.tokens import shard_paths

    try:
        beside = Path(shard_paths(config.data.path, "data.path")[0]).parent / "tokenizer.json"
    except TwinstepError:
        beside = None
    if beside is None or not beside.is_file():
        warnings.warn("the vocabulary is not recorded: no tokenizer.json beside the run's token shards (twinstep "
                      "data tokenize writes one); name it with --tokenizer bytes or --tokenizer PATH/tokenizer.json",
                      TwinstepWarning, stacklevel=3)
        return None
    recorded = ((meta or {}).get("data") or {}).get("fingerprint")
    if recorded is None or _fingerprint(config) != recorded:
        warnings.warn(f"the vocabulary is not recorded: the shards beside {beside} are not the ones the run trained "
                      f"on (their data fingerprint differs); name the tokenizer with --tokenizer",
                      TwinstepWarning, stacklevel=3)
        return None
    return file_vocabulary(str(beside))


def _fingerprint(config: Config) -> str | None:
    from conformance.data.datasets import load_dataset

    spec = config.data
    seed = spec.seed if spec.seed is not None else config.run.seed
    try:
        return load_dataset(spec, seed, spec.block_size or config.model.block_size).info.fingerprint
    except TwinstepError:
        return None


def run_vocabulary(config: Config, meta: dict[str, Any] | None, tokenizer: str | None, vocab_size: int) -> Vocabulary | None:
    """The run's vocabulary (see the module docstring), or None with a warning saying why."""
    data = config.data.name
    if data == "text":
        if tokenizer is not None:
            raise ConfigError("--tokenizer is for runs on token shards; this run's vocabulary is its corpus's "
                              "characters, recorded without it")
        recorded = ((meta or {}).get("data") or {}).get("fingerprint")
        chars = _text_chars(config, recorded)
        found = None if chars is None else char_vocabulary(tuple(chars))
    elif tokenizer is None:
        if data != "tokens":
            return None
        found = _beside_shards(config, meta)
        if found is None:
            return None
    else:
        found = byte_vocabulary() if tokenizer == "bytes" else file_vocabulary(tokenizer)
    if found is not None and found.size > vocab_size:
        raise InputError(f"--tokenizer: the vocabulary has {found.size} tokens; the model's has {vocab_size}")
    return found


def describe(vocab: Vocabulary | None) -> dict[str, Any] | None:
    """The vocabulary as config.json records it (`twinstep_vocabulary`)."""
    if vocab is None:
        return None
    out: dict[str, Any] = {"kind": vocab.kind, "size": vocab.size}
    if vocab.chars is not None:
        out["chars"] = "".join(vocab.chars)  # token i = chars[i]
    if vocab.source is not None:
        out["source"] = vocab.source
    return out


def tokenizer_json(vocab: Vocabulary) -> bytes:
    """The vocabulary's tokenizer.json bytes (a named file's own bytes, unchanged)."""
    return vocab.raw if vocab.raw is not None else json.dumps(vocab.tokenizer, ensure_ascii=False, indent=1).encode()


def tokenizer_files(vocab: Vocabulary, block_size: int) -> dict[str, bytes]:
    """tokenizer.json and tokenizer_config.json (PreTrainedTokenizerFast) for an export directory."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
              "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tokenizer_json(vocab),
            "tokenizer_config.json": (json.dumps(config, indent=1) + "\n").encode("utf-8")}
