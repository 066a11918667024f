"""Host random generators (Python's `random`, NumPy's legacy global) as checkpoint tensors + JSON.

Both backends include these in `capture_rng`, beside their framework's own generator: user code
(augmentations, hooks) may draw from them, and a resumed run must continue their streams too.
States are stored as uint32 tensors and plain JSON numbers, never as pickled objects.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np

from conformance.checkpoint import files as io
from conformance.errors import CheckpointError


def capture_host_rng() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """({"python_random", "numpy_global"}: uint32 arrays, metadata) for Python's and NumPy's globals."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    tensors = {
        "python_random": np.asarray(internal, np.uint32),
        "numpy_global": np.asarray(keys, np.uint32),
    }
    meta = {
        "python_random": {"version": version, "gauss_next": gauss},
        "numpy_global": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
    }
    return tensors, meta


def restore_host_rng(tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Put back what capture_host_rng captured; states absent from the checkpoint are left alone."""
    try:
        if "python_random" in tensors:
            m = meta["python_random"]
            state = tuple(int(v) for v in np.asarray(tensors["python_random"], np.uint32))
            random.setstate((int(m["version"]), state, m["gauss_next"]))
        if "numpy_global" in tensors:
            m = meta["numpy_global"]
            np.random.set_state((str(m["kind"]), np.asarray(tensors["numpy_global"], np.uint32), int(m["pos"]),
                                 int(m["has_gauss"]), float(m["cached_gaussian"])))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint RNG state for the host generators is malformed ({exc})") from None


def rank_prefix(rank: int) -> str:
    """The name prefix of rank `rank`'s RNG tensors in a checkpoint: "rank0/", "rank1/", ..."""
    return f"rank{int(rank)}/"


def pack_rank_rng(per_rank: list[tuple[dict[str, Any], dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every rank's (rng tensors, rng meta), in rank order, as one checkpoint's rng tensors and meta."""
    tensors: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for rank, (t, m) in enumerate(per_rank):
        tensors.update({f"{rank_prefix(rank)}{k}": v for k, v in t.items()})
        meta[rank_prefix(rank).rstrip("/")] = m
    return tensors, meta


def unpack_rank_rng(tensors: dict[str, Any], meta: dict[str, Any], rank: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Rank `rank`'s (rng tensors, rng meta) from a checkpoint, or None when it holds none for that
    rank (a resume with more ranks than the checkpoint had: that rank starts from its seed)."""
    prefix = rank_prefix(rank)
    mine = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    if not mine:
        return None
    return mine, dict((meta or {}).get(prefix.rstrip("/"), {}))


def gather_rng(tensors: dict[str, Any], meta: dict[str, Any],
               exchange: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every rank's (RNG tensors, RNG meta), in rank order, through `exchange(bytes) -> [bytes of
    every rank]` (safetensors + JSON over the wire, no pickle)."""
    blob = io.encode_tensors(tensors, "rng")
    header = json.dumps(meta).encode("utf-8")
    out = []
    for i, data in enumerate(exchange(len(header).to_bytes(8, "little") + header + blob)):
        n = int.from_bytes(data[:8], "little")
        out.append((io.decode_tensors(data[8 + n:], f"rank {i} RNG state"),  # type: ignore[arg-type]
                    json.loads(data[8:8 + n].decode("utf-8"))))
    return out
