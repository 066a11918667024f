"""An export directory written atomically: every file into a temporary directory beside `-o DIR`
(`.DIR.tmp-XXXXXXXX`), each fsync'ed, then one rename. A reader sees the old directory or the whole
new one; a killed export leaves at most the temporary directory (removed on failure otherwise).
An existing DIR is refused when it holds anything, unless `force`: then the old DIR is moved aside,
the new one renamed into place, and the old one deleted.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import safetensors.numpy

from conformance.errors import PathError
from conformance.files import check_entry, create_durable, fsync_dir, path_error


def safetensors_bytes(tensors: dict, metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file of NumPy arrays (C order), with `metadata` in its header."""
    import numpy as np

    return safetensors.numpy.save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=metadata)


def check_target(out: Path, force: bool) -> None:
    """Refuse `out` when it is not a directory, or holds anything and `force` is off."""
    if not check_entry(out, "directory"):
        return
    try:
        empty = next(os.scandir(out), None) is None
    except OSError as exc:
        raise path_error(out, exc, "read") from None
    if not empty and not force:
        raise PathError(f"-o {out} is not empty; choose another directory or pass --force to replace it "
                        f"(nothing was written)")


def write_directory(out: Path, files: dict[str, bytes], force: bool = False) -> Path:
    """Write `files` ({name: bytes}) as the directory `out` (see the module docstring)."""
    check_target(out, force)
    parent = out.parent
    tmp = parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    aside: Path | None = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(mode=0o755)
        for name, data in files.items():
            create_durable(tmp / name, data, 0o644)
        fsync_dir(tmp)
        if check_entry(out, "directory") and next(os.scandir(out), None) is not None:
            aside = parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, aside)
        os.replace(tmp, out)  # onto nothing, or onto an empty directory
        fsync_dir(parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None and not os.path.lexists(out):
            os.rename(aside, out)  # the old export back in place
        if isinstance(exc, OSError):
            raise path_error(out, exc, "write") from None
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return out
