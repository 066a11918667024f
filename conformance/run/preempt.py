"""Preemption: SIGTERM or SIGINT finish the current update, save, and stop with a line saying where.

    with Preemption() as stop:                  # session.open_run installs it; Run.close removes it
        for t in ...:
            ... one whole update, its metrics line, a due evaluation ...
            if stop.requested(agree):           # every rank decides alike (agree: any rank asked)
                raise stop.stopped(t + 1, checkpoint)   # after saving: conformance.run.loop.checkpoint_or_stop

A cluster that preempts a job sends SIGTERM (Slurm, Kubernetes; torchrun forwards it to every
worker), a user at a terminal SIGINT. The handler only records the signal: the update under way
finishes, the trainer writes a checkpoint of the state after it (atomic and verified like every
other, even with `checkpoint.every = 0`) and raises Preempted, which the CLI reports as one line
and exit status 128 + signal (143, 130). `--resume` continues from that checkpoint and equals the
uninterrupted run. A second signal of the same kind while the first is being honoured gets the
default behaviour (SIGINT: KeyboardInterrupt, SIGTERM: the process ends): a checkpoint in progress is
atomic, so nothing already saved is lost.

Handlers are installed only in the main thread (Python delivers signals there); elsewhere a run is
not preemptible this way. The previous handlers come back when the run ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from conformance.errors import Preempted

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """Records SIGTERM / SIGINT while installed (see the module docstring)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
        # the next one of this kind is not deferred: the default action (not an outer handler's, which
        # may have other plans for a signal outside the run)
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> "Preemption":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def requested(self, agree: Callable[[bool], bool] | None = None) -> bool:
        """Whether to stop after this update: a signal arrived here (or, with `agree`, on any rank:
        agree(flag) must return the same answer on every rank, e.g. an any-reduce)."""
        flag = self.signum is not None
        return agree(flag) if agree is not None else flag

    def stopped(self, updates_done: int, planned: int, checkpoint: Path) -> Preempted:
        """The Preempted error that ends the run after `updates_done` updates, saved to `checkpoint`."""
        signum = self.signum if self.signum is not None else signal.SIGTERM  # asked by another rank
        name = signal.Signals(signum).name
        return Preempted(f"stopped by {name} after update {updates_done} of {planned}; checkpoint {checkpoint}; "
                         f"continue with --resume", signal=signum, updates_done=updates_done, checkpoint=checkpoint)
