"""Text from a trained gpt (`twinstep sample`): the sampling loop, framework-neutral.

    tokens = generate(logits_fn, prompt_ids, 200, block_size=64, temperature=0.8, top_k=40, seed=1)

`logits_fn(window) -> logits` is a twin's `models.last_logits` (torch or JAX): the float64 logits
after the last token of a window of at most block_size tokens. Everything else happens here in
NumPy float64, so both backends make the same choices from the same logits: the window is the
last block_size tokens (nanoGPT's idx[:, -block_size:]); temperature 0 takes the argmax (greedy,
the first of equal maxima); otherwise the logits are divided by the temperature, top_k keeps the
k largest (nanoGPT's rule: every logit below the k-th largest becomes -inf, so ties at the k-th
stay), and the token is the inverse CDF of the softmax at one uniform draw per token from
PCG64(SeedSequence([seed, "sample"])). The same seed and logits give the same tokens on every
backend; logits that differ in the last bits change a token only where the draw falls that close
to a boundary of the CDF (float64 runs), more often in float32 or bfloat16 (docs/recipes.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from conformance.data.sampling import stream
from conformance.errors import ConfigError, InputError


def check_options(n: int, temperature: float, top_k: int | None) -> None:
    """One ConfigError naming the option that cannot work."""
    if n < 1:
        raise ConfigError(f"--tokens must be at least 1; received {n}")
    if not temperature >= 0 or temperature == float("inf"):
        raise ConfigError(f"--temperature must be a finite number >= 0 (0: greedy); received {temperature}")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"--top-k must be at least 1; received {top_k}")


def choose(logits: np.ndarray, temperature: float, top_k: int | None, u: float) -> int:
    """The next token from one position's logits and a uniform draw u in [0, 1)."""
    z = np.asarray(logits, np.float64)
    if temperature == 0:
        return int(np.argmax(z))
    z = z / temperature
    if top_k is not None and top_k < z.size:
        z = np.where(z < np.sort(z)[-top_k], -np.inf, z)
    p = np.exp(z - z.max())
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), z.size - 1))


def generate(logits_fn: Callable[[np.ndarray], np.ndarray], prompt: list[int], n: int, *, block_size: int,
             temperature: float = 1.0, top_k: int | None = None, seed: int = 0) -> list[int]:
    """`n` new tokens after `prompt` (see the module docstring)."""
    check_options(n, temperature, top_k)
    if not prompt:
        raise ConfigError("--prompt is empty: the model needs at least one token to continue")
    rng = stream(seed, "sample")
    ids = list(prompt)
    for _ in range(n):
        u = float(rng.random())  # drawn for greedy too: the stream's position is the token's
        ids.append(choose(logits_fn(np.asarray(ids[-block_size:], np.int64)), temperature, top_k, u))
    return ids[len(prompt):]


class Codec:
    """The run's vocabulary as text <-> token ids (conformance.export.vocab.Vocabulary): the
    corpus's characters, UTF-8 bytes, or a Hugging Face tokenizer.json (the tokenizers package)."""

    def __init__(self, vocab: Any) -> None:
        self.vocab = vocab
        self._tokenizer = None
        if vocab.kind == "chars":
            self._index = {c: i for i, c in enumerate(vocab.chars)}
        elif vocab.kind == "tokenizer.json":
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ConfigError("this run's vocabulary is a tokenizer.json, which needs the tokenizers package: "
                                  "pip install 'twinstep[tokenizers]'") from None
            self._tokenizer = Tokenizer.from_str(json.dumps(vocab.tokenizer))

    def encode(self, text: str) -> list[int]:
        kind = self.vocab.kind
        if kind == "chars":
            missing = sorted({c for c in text if c not in self._index})
            if missing:
                raise InputError(f"--prompt: {''.join(missing)!r} not in the run's vocabulary of "
                                 f"{self.vocab.size} characters")
            return [self._index[c] for c in text]
        if kind == "bytes":
            return list(text.encode("utf-8"))
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        kind = self.vocab.kind
        if kind == "chars":
            return "".join(self.vocab.chars[i] if i < self.vocab.size else "\ufffd" for i in ids)
        if kind == "bytes":
            return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
        return self._tokenizer.decode(ids)
