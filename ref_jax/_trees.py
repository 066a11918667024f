"""Named leaves of parameter pytrees: error messages name parameters the way the checkpoints do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax


def _part(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def named_leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """[(dotted name, leaf)]: {"w": .., "blk": {"b": ..}} -> "w", "blk.b". Mappings keep their own
    (insertion) order, like torch's named_parameters; other containers use JAX's flattening order."""
    if isinstance(tree, Mapping):
        out: list[tuple[str, Any]] = []
        for key, sub in tree.items():
            out.extend(named_leaves(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    named = []
    for path, leaf in flat:
        rest = ".".join(_part(k) for k in path)
        named.append((".".join(p for p in (prefix, rest) if p) or "<root>", leaf))
    return named


def is_traced(*values: Any) -> bool:
    """True inside jit/grad tracing, where host-side checks (and raising) are impossible."""
    return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))
