"""Give freed heap memory back to the operating system (glibc's malloc_trim; nothing elsewhere)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): freed memory stays with the process
        return None


def trim() -> None:
    """Return the heap's free pages: glibc keeps what a process frees (e.g. thousands of dropped
    compiled programs) mapped, so its resident size never shrinks without this."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)


def resident_mib() -> float | None:
    """This process's resident set size now, in MiB (Linux's /proc/self/statm); None where unreadable."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
