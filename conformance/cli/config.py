"""`twinstep config`: validate a config and print it resolved (every default filled in; the fields
the chosen components never read are left out unless `--all`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from conformance.config import dump_config, load_config


def add_parser(sub: Any) -> None:
    p = sub.add_parser("config", help="validate a config and print it with every default filled in",
                       description="Validate CONFIG (default: the built-in default) with any --set "
                                   "overrides and print the resolved TOML; exit 2 on the first problem.")
    p.add_argument("config", nargs="?", help="a TOML config file (omit for the built-in default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a value (VALUE in TOML syntax; repeatable)")
    p.add_argument("-o", "--output", metavar="PATH", help="write the resolved config here instead of stdout")
    p.add_argument("--all", action="store_true",
                   help="every field, also those the chosen model, data, loss, optimizer and schedule never read")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    text = dump_config(config, read_only=not args.all)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
