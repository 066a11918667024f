"""The `twinstep` command line. Each subcommand is a module here with `add_parser` and `run`.

Errors the user can fix (a bad config, a malformed case, a corrupt checkpoint, an unusable path)
are printed as one line on stderr with exit status 2, never as a traceback (usage errors too:
an unknown option or choice is one line naming it); TWINSTEP_DEBUG=1 shows
the traceback. A run stopped by SIGTERM / SIGINT after saving (conformance.errors.Preempted) prints
where it saved and exits 128 + signal (143, 130). Warnings, twinstep's and any library's, are one
line each: `twinstep: warning: <message>`, never Python's two-line format with a source line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from conformance.errors import Preempted, TwinstepError, TwinstepWarning

COMMANDS: tuple[str, ...] = ("conform", "config", "train", "checkpoint", "data", "schedule", "plot", "compare", "port",
                             "export", "sample", "drift")


def show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
    """warnings.showwarning for the CLI: one line, no source line."""
    kind = "" if issubclass(category, TwinstepWarning) else f"{category.__name__}: "
    text = " ".join(str(message).split())
    try:
        print(f"twinstep: warning: {kind}{text}", file=file or sys.stderr)
    except (OSError, ValueError):
        pass  # stderr closed: a warning must not end the run


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser with its usage errors in one line (argparse prints the usage first): the
    choices are in argparse's message already, `--help` shows the usage."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    shown = warnings.showwarning
    warnings.showwarning = show_warning
    try:
        return int(args.run(args) or 0)
    except Preempted as exc:
        print(f"twinstep: {exc}", file=sys.stderr)
        return exc.exit_status
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
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":
    sys.exit(main())
