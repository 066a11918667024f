"""Owned run directories: one run at a time in an `--out`, never a user's file overwritten.

    owner = claim(out, resume=False)     # PathError if busy, foreign or unusable; rank 0 only
    ...                                   # the whole run
    owner.release()

- **A lock held for the whole run.** `DIR/.twinstep.lock` is locked with `fcntl.flock` (exclusive,
  non-blocking) and holds the holder's pid; a second run into the same directory is refused at once
  with one line naming that pid. The kernel drops the lock when the holder exits, however it exits,
  so a killed run never leaves the directory locked. The lock file stays: it marks the directory as
  a twinstep run's.
- **Nothing of anyone else's is overwritten.** A fresh run (no --resume) may write into a directory
  that does not exist, is empty, or is marked as a twinstep run's (and holds no checkpoints:
  session.open_run refuses those); a resume also into an older twinstep run (one with
  checkpoints/step-*). Anything else (a user's config.toml or metrics.jsonl, say) is refused,
  naming the first foreign entry.
- **No link, FIFO or device where a run's file belongs.** config.toml, metrics.jsonl and the lock
  file must be regular files and checkpoints/ a real directory (no symbolic link out of the run).
- **Temp files of every kind are removed at the start**, after the lock is held (before it, they
  may be another live run's): `.config.toml.XXXXXXXX` (written, then renamed: a kill in between
  leaves one), `.metrics.jsonl.tmp-*`, `metrics.jsonl.tmp` (older versions), and checkpoints/.tmp-*
  (conformance.checkpoint.prepare_directory).

Every OSError on these paths is a PathError naming the path and the cause (read-only file system,
no space left, a file where the directory belongs, ...).
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

from conformance.errors import PathError
from conformance.files import check_entry, kind, path_error

LOCK = ".twinstep.lock"
OWN = ("config.toml", "metrics.jsonl", "checkpoints", "tensorboard", LOCK)
TEMP = re.compile(r"^(\.config\.toml\.[A-Za-z0-9_]{8}|\.config\.toml\.tmp-[0-9a-f]{8}|\.metrics\.jsonl\.tmp-[0-9a-f]{8}"
                  r"|metrics\.jsonl\.tmp)$")


class RunDir:
    """A claimed run directory: `path`, and the open lock file (released by `release`)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        """Give up the lock (also done by the kernel when the process ends)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


def _make(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise PathError(f"--out {out} is {kind(os.stat(out).st_mode)}, not a directory") from None
    except OSError as exc:
        raise path_error(out, exc, "create the output directory") from None
    if not out.is_dir():
        raise PathError(f"--out {out} is not a directory")


def _foreign(out: Path, resume: bool) -> str | None:
    """The first entry of `out` this run may not take over, or None."""
    try:
        names = sorted(os.listdir(out))
    except OSError as exc:
        raise path_error(out, exc, "list the output directory") from None
    if LOCK in names or not names:
        return None
    older_run = resume and "checkpoints" in names and any(n.startswith("step-") for n in _listing(out / "checkpoints"))
    for name in names:
        if not (older_run and (name in OWN or TEMP.match(name))):
            return name
    return None


def _listing(path: Path) -> list[str]:
    try:
        return os.listdir(path) if check_entry(path, "directory") else []
    except OSError:
        return []


def _lock(out: Path) -> int:
    path = out / LOCK
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC
    check_entry(path, "file")
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise path_error(path, exc, "open the run's lock file") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise PathError(f"{out} is in use by another twinstep run (pid {holder}); wait for it to finish or "
                        f"choose another --out") from None
    except OSError as exc:
        os.close(fd)
        raise path_error(path, exc, "lock") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise path_error(path, exc, "write the run's lock file") from None
    return fd


def clean_temp(out: Path) -> list[Path]:
    """Remove the temp files a killed run may leave in `out` (call with the lock held)."""
    removed = []
    for name in sorted(os.listdir(out)):
        if TEMP.match(name):
            try:
                (out / name).unlink()
            except OSError as exc:
                raise path_error(out / name, exc, "remove a leftover temp file") from None
            removed.append(out / name)
    return removed


def claim(out: str | Path, resume: bool) -> RunDir:
    """Create (if needed), check, lock and clean `out` for one run (see the module docstring)."""
    out = Path(out)
    _make(out)
    foreign = _foreign(out, resume)
    if foreign is not None:
        raise PathError(f"--out {out} already holds {foreign!r}, which no twinstep run wrote there; choose an "
                        f"empty or new directory (nothing was overwritten)")
    fd = _lock(out)
    owner = RunDir(out, fd)
    try:
        for name in OWN[:2]:
            check_entry(out / name, "file")
        check_entry(out / "checkpoints", "directory")
        clean_temp(out)
    except BaseException:
        owner.release()
        raise
    return owner
