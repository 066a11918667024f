"""The manifest vouches for itself (conformance/checkpoint/manifest.py).

Every single-bit flip of a small manifest.json, all of its bits, is refused (before format 2, 1345
of 8344 such flips were accepted); the negative control is a reader that checks what format 1
checked (JSON, the schema, no self-hash), which accepts some of the same flips. Format 1 manifests,
written before the self-hash, still load under the strict schema.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from conformance import checkpoint as ck
from conformance.checkpoint import files as cio
from conformance.checkpoint.manifest import parse_manifest
from conformance.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointRejected,
)


def small_checkpoint(directory: Path) -> Path:
    state = ck.TrainingState(update=3, model={"w": np.arange(3, dtype=np.float32)},
                             optimizer={"w": {"m": np.zeros(3, np.float32)}}, rng={"k": np.zeros(2, np.uint32)},
                             meta={"counters": {"updates_done": 3}}, config="[run]\nseed = 1\n")
    return ck.save_checkpoint(directory, state, versions={"torch": "2"}, val_loss=0.5)


def flips(data: bytes) -> list[bytes]:
    out = []
    for i in range(len(data)):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[i] ^= 1 << bit
            out.append(bytes(flipped))
    return out


def v1_reader(data: bytes, where: Path) -> None:
    """Negative control: what format 1 checked (valid JSON, the schema), as format 1 of the same
    fields without a self-hash; raises on refusal."""
    manifest = json.loads(data)  # raises on broken JSON
    if not isinstance(manifest, dict) or manifest.get("format_version") != 2:
        raise ValueError("not ours")
    manifest.pop("manifest_sha256", None)
    manifest["format_version"] = 1
    parse_manifest(cio.encode_json(manifest, "m"), where, "step-00000003")


def test_every_single_bit_flip_of_the_manifest_is_refused(tmp_path: Path) -> None:
    step = small_checkpoint(tmp_path)
    path = step / ck.MANIFEST
    pristine = path.read_bytes()
    ck.verify_checkpoint(step)
    accepted, weaker = [], 0
    for flipped in flips(pristine):
        path.write_bytes(flipped)
        try:
            ck.verify_checkpoint(step)
            accepted.append(flipped)
        except (CheckpointCorruptError, CheckpointRejected):
            pass
        try:
            v1_reader(flipped, path)
            weaker += 1
        except (ValueError, CheckpointError, UnicodeDecodeError):
            pass
    path.write_bytes(pristine)
    assert len(pristine) * 8 > 4000 and accepted == []
    assert weaker > 0  # the control: without the self-hash, flips in created_unix, versions ... pass
    ck.verify_checkpoint(step)


def test_a_manifest_that_parses_to_the_same_fields_but_is_not_canonical_is_refused(tmp_path: Path) -> None:
    step = small_checkpoint(tmp_path)
    path = step / ck.MANIFEST
    fields = json.loads(path.read_bytes())
    os.chmod(path, 0o600)
    path.write_text(json.dumps(fields))  # the same fields, other bytes
    with pytest.raises(CheckpointCorruptError, match="canonical"):
        ck.verify_checkpoint(step)


def test_format_1_checkpoints_still_load(tmp_path: Path) -> None:
    step = small_checkpoint(tmp_path)
    path = step / ck.MANIFEST
    fields = json.loads(path.read_bytes())
    del fields["manifest_sha256"]
    fields["format_version"] = 1
    os.chmod(path, 0o600)
    path.write_bytes(cio.encode_json(fields, "m"))  # what twinstep wrote before format 2
    assert ck.load_checkpoint(step).manifest["format_version"] == 1
    fields["world_size"] = 0  # the strict schema applies to format 1 too
    path.write_bytes(cio.encode_json(fields, "m"))
    with pytest.raises(CheckpointCorruptError, match="world_size must be an integer in"):
        ck.verify_checkpoint(step)


@pytest.mark.parametrize("change, match", [
    (lambda m: m.__setitem__("note", "x"), "unknown key 'note'"),
    (lambda m: m.pop("created_unix"), "key 'created_unix' is missing"),
    (lambda m: m.__setitem__("created_unix", -1.0), "created_unix must be"),
    (lambda m: m.__setitem__("world_size", True), "world_size must be"),
    (lambda m: m.__setitem__("val_loss", "0.5"), "val_loss must be a finite number or null"),
    (lambda m: m.__setitem__("versions", {"torch": 2}), "versions.torch must be a version string"),
    (lambda m: m.__setitem__("versions", {"a b": "1"}), "versions.a b must be a version string"),
    (lambda m: m.__setitem__("config_sha256", "0" * 64), "config_sha256 differs"),
    (lambda m: m["files"]["state.json"].__setitem__("mode", 1), "files.state.json must be a table of exactly"),
    (lambda m: m["files"]["state.json"].__setitem__("sha256", "A" * 64), "files.state.json.sha256 must be"),
    (lambda m: m["files"]["model.safetensors"].__setitem__("size", 2**63), "files.model.safetensors.size must be"),
    (lambda m: m.__setitem__("update", 2**64), "update must be an integer in"),
])
def test_every_field_of_a_rehashed_manifest_is_checked(tmp_path: Path, change, match: str) -> None:
    step = small_checkpoint(tmp_path)
    path = step / ck.MANIFEST
    fields = json.loads(path.read_bytes())
    change(fields)
    fields.pop("manifest_sha256")
    fields["manifest_sha256"] = hashlib.sha256(cio.encode_json(fields, "m")).hexdigest()
    os.chmod(path, 0o600)
    path.write_bytes(cio.encode_json(fields, "m"))
    with pytest.raises(CheckpointError, match=match):
        ck.verify_checkpoint(step)
