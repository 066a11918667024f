"""Error classes shared by every backend.

Both ref_torch and ref_jax raise these same classes, so a caller (or a conformance case with
`[expected] error = "InputError"`) sees one error vocabulary whichever framework ran. Every message is
one line that names the field, tensor or file and says what was expected.
"""

from __future__ import annotations


class TwinstepError(Exception):
    """Base class: a user-facing, one-line error. The CLI prints it without a traceback."""

    def __init__(self, message: str) -> None:
        # One line, always: a multi-line message would break logs and the CLI contract.
        super().__init__(" ".join(str(message).split()))


class ConfigError(TwinstepError, ValueError):
    """A config (or `--set` override) is malformed: unknown key, wrong type, out-of-range value."""


class CaseError(TwinstepError, ValueError):
    """A conformance case file is malformed; the message names the file and the key."""


class InputError(TwinstepError, ValueError):
    """Data handed to a loss or model is invalid (labels out of range, silent broadcasting, NaN …)."""


class UnsupportedError(TwinstepError):
    """A backend does not implement a feature or case kind (yet)."""


class BackendError(TwinstepError):
    """A backend named by the user (`--backend NAME`) cannot be found or imported."""


class NonFiniteError(TwinstepError, FloatingPointError):
    """A loss or gradient went non-finite under `on_nonfinite = "raise"`, or too many updates were skipped."""


class CheckpointError(TwinstepError):
    """A checkpoint cannot be written or read."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint fails its integrity check (hash mismatch, truncated or missing file)."""


class CheckpointRejected(CheckpointError):
    """A checkpoint is refused before anything is read (unsafe path, permissions, symlink, foreign format)."""


class PathError(TwinstepError):
    """A file or directory a run reads or writes cannot be used: not a regular file (a FIFO, a
    device, a socket), too large, a symbolic link out of the run directory, read-only, full, a file
    where a directory belongs, or a run directory in use by another run. The message names the path
    and the cause."""


class Preempted(TwinstepError):
    """A run stopped by SIGTERM or SIGINT after finishing its current update and saving a checkpoint.
    `signal`: the signal number; `updates_done`; `checkpoint`: the checkpoint written (the run
    resumes from it with --resume); `exit_status`: 128 + signal, as a shell reports a process the
    signal ended (143 for SIGTERM, 130 for SIGINT)."""

    def __init__(self, message: str, *, signal: int, updates_done: int, checkpoint: object = None) -> None:
        super().__init__(message)
        self.signal = signal
        self.updates_done = updates_done
        self.checkpoint = checkpoint
        self.exit_status = 128 + signal


class TwinstepWarning(UserWarning):
    """A one-line warning of twinstep (the CLI prints it as `twinstep: warning: <message>`)."""


ERROR_CLASSES: dict[str, type[TwinstepError]] = {
    cls.__name__: cls
    for cls in (
        TwinstepError,
        ConfigError,
        CaseError,
        InputError,
        UnsupportedError,
        BackendError,
        NonFiniteError,
        CheckpointError,
        CheckpointCorruptError,
        CheckpointRejected,
        PathError,
        Preempted,
    )
}
