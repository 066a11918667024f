"""Data files are opened through conformance.files: a FIFO, a device, a socket or a directory named as
data (`data.path = "/dev/zero"`, a glob that matches a named pipe) is one error line at once, never
a read that blocks or never ends. The open descriptor is checked, then read or mapped:
np.memmap maps the checked file itself, not whatever the path names later."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from conformance.errors import InputError
from conformance.files import open_regular


def open_data(path: str | Path, shown: str, error: type[Exception] = InputError,
              missing: type[Exception] | None = None) -> tuple[BinaryIO, int]:
    """(binary file, size in bytes) of a regular file opened for reading; anything else is one
    `error` line starting with `shown` (e.g. "data.path: DIR/train_000.bin")."""
    fd, st = open_regular(path, error=error, missing=missing, shown=shown)
    return os.fdopen(fd, "rb"), int(st.st_size)
