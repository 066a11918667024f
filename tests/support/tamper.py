"""Change a checkpoint as a tamperer who knows the format would: rewrite a file and every hash that
vouches for it (its manifest entry, config_sha256, the manifest's own hash), so that only the
checks of what the state means can refuse it (conformance.run.validate)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from conformance.checkpoint import files as cio


def rehash_manifest(step: Path, change: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Rewrite step/manifest.json canonically with fresh file entries, after `change(manifest)`."""
    path = step / "manifest.json"
    m = json.loads(path.read_bytes())
    for name in m["files"]:
        data = (step / name).read_bytes()
        m["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    m["config_sha256"] = m["files"]["config.toml"]["sha256"]
    if change is not None:
        change(m)
    m.pop("manifest_sha256", None)
    if m.get("format_version", 2) >= 2:
        m["manifest_sha256"] = hashlib.sha256(cio.encode_json(m, "m")).hexdigest()
    write(step / "manifest.json", cio.encode_json(m, "m"))


def write(path: Path, data: bytes) -> None:
    os.chmod(path, 0o600)
    path.write_bytes(data)


def rewrite(step: Path, name: str, data: bytes) -> None:
    """Replace one file of a checkpoint and re-hash the manifest."""
    write(step / name, data)
    rehash_manifest(step)


def edit_state(step: Path, change: Callable[[dict[str, Any]], None], raw: Callable[[str], str] | None = None) -> None:
    """Change state.json (a dict edit, and optionally a raw text edit after it), re-hashed."""
    meta = json.loads((step / "state.json").read_bytes())
    change(meta)
    text = json.dumps(meta, sort_keys=True, indent=1) + "\n"
    rewrite(step, "state.json", (raw(text) if raw else text).encode())


def edit_tensors(step: Path, name: str, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Change the tensors of one safetensors file of a checkpoint, re-hashed."""
    tensors = dict(safetensors.numpy.load((step / name).read_bytes()))
    change(tensors)
    rewrite(step, name, safetensors.numpy.save(tensors))
