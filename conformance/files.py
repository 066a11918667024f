"""Open nothing blindly: reading a file a user named, or one inside a run, without trusting its path.

    data = read_regular(path, limit=1 << 20, what="config")    # bytes, or one PathError line

A path may name a FIFO (opening it for reading blocks until a writer comes; reading it never ends),
a device (`/dev/zero` reads forever), a socket, a directory, or a file far larger than its purpose.
So every read here opens with O_NONBLOCK (a FIFO opens at once instead of waiting for a writer) and
O_NOCTTY, checks the OPEN descriptor with fstat (no race with a path swapped after a check) to be a
regular file of at most `limit` bytes BEFORE reading, and then reads at most `limit` + 1 bytes (a
file still growing is refused, not followed). `follow=False` also refuses a symbolic link as the
last component (O_NOFOLLOW); `dir_fd` opens relative to a directory already opened without
following links, so nothing inside a run or checkpoint directory can point out of it.

Errors name the path and the cause and are one line: the caller picks the class (ConfigError for a
config, CheckpointRejected for a checkpoint file, PathError otherwise). The data pipeline's file
datasets should read through `read_regular` too (`data.path = "/dev/zero"` must be refused, not read).
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from pathlib import Path

from conformance.errors import PathError

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link",
}
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words ("a FIFO (named pipe)", "a regular file", ...)."""
    return _KINDS.get(stat.S_IFMT(mode), "a regular file" if stat.S_ISREG(mode) else "not a regular file")


def _describe(path: str | Path, dir_fd: int | None) -> str:
    # Why an open failed, in words, when the path exists as something that cannot be opened (a socket).
    try:
        return f"is {kind(os.lstat(path, dir_fd=dir_fd).st_mode)}"
    except OSError:
        return ""


def open_regular(path: str | Path, *, follow: bool = True, dir_fd: int | None = None,
                 error: type[Exception] = PathError, missing: type[Exception] | None = None,
                 shown: str | Path | None = None) -> tuple[int, os.stat_result]:
    """(fd, fstat) of a regular file opened for reading without blocking; anything else is `error`
    (`missing`: the class for a file that does not exist, default `error`). `shown`: the path as
    messages name it (default: `path`)."""
    name = shown if shown is not None else path
    try:
        fd = os.open(path, _READ_FLAGS | (0 if follow else NOFOLLOW), dir_fd=dir_fd)
    except FileNotFoundError:
        raise (missing or error)(f"{name}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise error(f"{name} is a symbolic link; only a regular file is read here") from None
        what = _describe(path, dir_fd)
        if what and what != "is a regular file":
            raise error(f"{name} {what}, not a regular file") from None
        raise error(f"{name}: cannot open ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{name} is {kind(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_fd(fd: int, st: os.stat_result, limit: int, *, what: str = "file", error: type[Exception] = PathError,
            shown: str | Path = "") -> bytes:
    """At most `limit` bytes of an open regular file: refused before reading when fstat says it is
    larger, and refused when it grows past `limit` while being read."""
    if st.st_size > limit:
        raise error(f"{shown} has {st.st_size} bytes; a {what} may have at most {limit}")
    chunks, left = [], limit + 1  # one byte more than allowed reveals a file still growing
    try:
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise error(f"{shown}: cannot read ({exc.strerror})") from None
    data = b"".join(chunks)
    if len(data) > limit:
        raise error(f"{shown} grew past {limit} bytes while being read; a {what} may have at most {limit}")
    return data


def read_regular(path: str | Path, limit: int, *, what: str = "file", follow: bool = True,
                 dir_fd: int | None = None, error: type[Exception] = PathError,
                 missing: type[Exception] | None = None, shown: str | Path | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see the module docstring); any other
    kind of file, a larger one or an unreadable one is one `error` line naming the path."""
    name = shown if shown is not None else path
    fd, st = open_regular(path, follow=follow, dir_fd=dir_fd, error=error, missing=missing, shown=name)
    try:
        return read_fd(fd, st, limit, what=what, error=error, shown=name)
    finally:
        os.close(fd)


def path_error(path: str | Path, exc: OSError, doing: str) -> PathError:
    """An OSError on a user's path as one PathError line: 'DIR/metrics.jsonl: cannot write (No space
    left on device)'."""
    cause = exc.strerror or type(exc).__name__
    if isinstance(exc, FileExistsError) or exc.errno == errno.ENOTDIR:
        cause = f"{cause}: a file is in the way of a directory"
    return PathError(f"{path}: cannot {doing} ({cause})")


def check_entry(path: Path, want: str, error: type[Exception] = PathError) -> bool:
    """Whether `path` exists as `want` ("file" or "directory"), refusing a symbolic link or any other
    kind of entry there (False: nothing there)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise path_error(path, exc, "inspect") from None
    ok = stat.S_ISDIR(st.st_mode) if want == "directory" else stat.S_ISREG(st.st_mode)
    if not ok:
        hint = " (a link could point out of the run directory)" if stat.S_ISLNK(st.st_mode) else ""
        raise error(f"{path} is {kind(st.st_mode)}{hint}; twinstep needs a {want} there")
    return True


def open_exclusive(path: Path, mode: int = 0o600) -> int:
    """A new file at `path` (it must not exist, nor be a link) opened for writing: its descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, mode)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of `data` (os.write may write less; at most 64 MiB per call)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view[:1 << 26]):]


def create_durable(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create `path` (it must not exist, nor be a link), write all of `data` and fsync it; an
    OSError is the caller's to name."""
    fd = open_exclusive(path, mode)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory, so that the entries created or renamed in it are durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file so that a reader sees the old or the new content, never a mix (a
    temp file `.NAME.tmp-XXXXXXXX` beside it, fsync'ed, renamed; a kill leaves at most that temp
    file, which the next run removes: conformance.run.rundir)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """write_text_atomic for bytes."""
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        create_durable(tmp, data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise path_error(path, exc, "write") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
