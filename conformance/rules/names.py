"""Neutral names of a user's model: a framework's own names, renamed by `[model] rename`.

Both trainers name a user's tensors by their framework's own path (torch `named_parameters()` /
`named_buffers()`; JAX pytree paths joined with "."), then apply the config's `rename` table
`{own name: neutral name}`, so the same model written in torch and in NNX can share one set of
names (and with it checkpoints, parameter groups and `twinstep compare`). One table serves both
frameworks: an entry whose key this model does not have is fine when its value is already one of
its names (the other framework's entry); an entry that matches neither is a ConfigError, as is a
rename onto a name the model already uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from conformance.errors import ConfigError


def neutral_names(own: Sequence[str], rename: Mapping[str, str]) -> dict[str, str]:
    """{own name: neutral name} for every name of `own`, in order (see the module docstring)."""
    have = set(own)
    for key, value in rename.items():
        if key not in have and value not in have:
            raise ConfigError(f"model.rename: {key!r} names nothing in this model, nor does {value!r} "
                              f"(its names start {sorted(have)[:4]})")
    out = {name: rename.get(name, name) for name in own}
    seen: dict[str, str] = {}
    for name, neutral in out.items():
        if neutral in seen:
            raise ConfigError(f"model.rename: {name!r} and {seen[neutral]!r} would both be named {neutral!r}")
        seen[neutral] = name
    return out
