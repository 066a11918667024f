"""Read the history an offline W&B run wrote (DIR/wandb/offline-run-*/run-ID.wandb) without a server.

The file is W&B's record log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then LevelDB-style
records in 32 KiB blocks (crc32c, little-endian length, type FULL/FIRST/MIDDLE/LAST), each a
`wandb_internal_pb2.Record` protobuf. wandb 0.31 writes it from its Go core and no longer ships a
Python reader, so the tests read it here (only to check what a run sent)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B record log")
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's zero-filled tail
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        parts += chunk
        if kind in (1, 4):  # FULL, LAST
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def history(run_dir: Path, run_id: str) -> dict[int, dict[str, Any]]:
    """step -> the values logged at that step, over every offline file of run `run_id` (a resumed
    run writes another); a step logged twice is an error."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        for record in records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            step = int(row.pop("_step"))
            if step in out:
                raise AssertionError(f"step {step} logged twice")
            out[step] = {k: v for k, v in row.items() if not k.startswith("_")}
    return out
