"""Crash a run at an exact moment, for the kill tests (a test-only entry point; production code has
no fault hook, only the `events` observer of conformance.events).

    python tests/support/faults.py micro_batch update=9 index=1 -- train CONFIG --backend torch --out DIR
    python tests/support/faults.py checkpoint stage=before_manifest -- train CONFIG --out DIR

runs `twinstep train ...` with an observer that ends the process with status 137 (as SIGKILL would:
no cleanup, no flush) at the first event with that name whose info matches every key=value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from conformance.events import Events

KILLED = 137


def die_at(name: str, **match: Any) -> Events:
    """An observer that exits the process abruptly at the first event `name` whose info has `match`."""
    want = {k: str(v) for k, v in match.items()}

    def observe(event: str, info: Mapping[str, Any]) -> None:
        if event == name and all(str(info.get(k)) == v for k, v in want.items()):
            os._exit(KILLED)

    return observe


def fault_args(name: str, **match: Any) -> list[str]:
    """The command-line prefix that runs twinstep under die_at(name, **match)."""
    return [sys.executable, __file__, name, *(f"{k}={v}" for k, v in match.items()), "--"]


def main(argv: list[str]) -> int:
    split = argv.index("--")
    name, pairs, rest = argv[0], argv[1:split], argv[split + 1:]
    match = dict(p.split("=", 1) for p in pairs)
    from conformance.cli import build_parser

    args = build_parser().parse_args(rest)
    return int(args.run(args, events=die_at(name, **match)) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
