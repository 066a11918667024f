"""Crash a run at an exact moment, for the kill tests (a test-only entry point; production code has
no fault hook, only the `events` observer of conformance.events).

    python tests/support/faults.py micro_batch update=9 index=1 -- train CONFIG --backend torch --out DIR
    python tests/support/faults.py checkpoint stage=before_manifest -- train CONFIG --out DIR

runs `twinstep train ...` with an observer that ends the process with status 137 (as SIGKILL would:
no cleanup, no flush) at the first event with that name whose info matches every key=value.

    python tests/support/faults.py --send-signal TERM micro_batch update=3 -- train CONFIG --out DIR
    torchrun ... tests/support/faults.py --send-signal TERM --rank 1 micro_batch update=3 -- train ...

sends the process itself SIGTERM (or INT) there instead, once (with --rank, only on that torchrun
rank), as a cluster preempting the job would: the run finishes the update, saves and stops.

    torchrun ... tests/support/faults.py --rank 1 checkpoint stage=after_first_file -- train ...

kills only rank 1, here right after its shard of a sharded checkpoint is durable (before it reports it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from conformance.events import Events

KILLED = 137


def die_at(name: str, rank: int | None = None, **match: Any) -> Events:
    """An observer that exits the process abruptly at the first event `name` whose info has `match`
    (on torchrun rank `rank` only, when given)."""
    want = {k: str(v) for k, v in match.items()}
    mine = rank is None or int(os.environ.get("RANK", "0")) == rank

    def observe(event: str, info: Mapping[str, Any]) -> None:
        if mine and event == name and all(str(info.get(k)) == v for k, v in want.items()):
            os._exit(KILLED)

    return observe


def signal_at(signum: int, name: str, rank: int | None = None, **match: Any) -> Events:
    """An observer that sends the process `signum` at the first event `name` whose info has `match`
    (on torchrun rank `rank` only, when given)."""
    want = {k: str(v) for k, v in match.items()}
    sent = [rank is not None and int(os.environ.get("RANK", "0")) != rank]

    def observe(event: str, info: Mapping[str, Any]) -> None:
        if not sent[0] and event == name and all(str(info.get(k)) == v for k, v in want.items()):
            sent[0] = True
            os.kill(os.getpid(), signum)

    return observe


def fault_args(name: str, *, signal: str | None = None, rank: int | None = None, **match: Any) -> list[str]:
    """The command-line prefix that runs twinstep under die_at(name, **match), or under
    signal_at(SIG<signal>, name, rank, **match)."""
    # not "--signal": torchrun's argparse scans the script's arguments too and refuses a prefix of
    # its own --signals-to-handle as ambiguous
    head = [*(["--send-signal", signal] if signal else []), *(["--rank", str(rank)] if rank is not None else [])]
    return [sys.executable, __file__, *head, name, *(f"{k}={v}" for k, v in match.items()), "--"]


def main(argv: list[str]) -> int:
    import signal as signals

    sig, rank = None, None
    while argv[0] in ("--send-signal", "--rank"):
        if argv[0] == "--send-signal":
            sig = getattr(signals, f"SIG{argv[1]}")
        else:
            rank = int(argv[1])
        argv = argv[2:]
    split = argv.index("--")
    name, pairs, rest = argv[0], argv[1:split], argv[split + 1:]
    match = dict(p.split("=", 1) for p in pairs)
    from conformance.cli import build_parser
    from conformance.errors import Preempted

    events = die_at(name, rank, **match) if sig is None else signal_at(sig, name, rank, **match)
    args = build_parser().parse_args(rest)
    try:
        return int(args.run(args, events=events) or 0)
    except Preempted as exc:  # as conformance.cli.main reports it
        print(f"twinstep: {exc}", file=sys.stderr)
        return exc.exit_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
