"""The `twinstep` command line. Each subcommand is a module here with `add_parser` and `run`.

Errors the user can fix (a bad config, a malformed case, a corrupt checkpoint) are printed as one
line on stderr with exit status 2, never as a traceback; TWINSTEP_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from conformance.errors import TwinstepError

COMMANDS: tuple[str, ...] = ("conform", "config", "train", "data", "schedule", "plot", "compare", "port")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="twinstep",
        description="One training pipeline in PyTorch and JAX, proven equal by a conformance suite.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"conformance.cli.{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    debug = os.environ.get("TWINSTEP_DEBUG") == "1"
    try:
        return int(args.run(args) or 0)
    except TwinstepError as exc:
        if debug:
            raise
        print(f"twinstep: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("twinstep: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal bug: still one line, with a way to see more
        if debug:
            raise
        text = " ".join(str(exc).split())
        print(f"twinstep: internal error: {type(exc).__name__}: {text} (TWINSTEP_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
