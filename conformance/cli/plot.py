"""`twinstep plot KIND ...`: figures (matplotlib, Agg backend: no display needed).

    twinstep plot schedule run.toml -o lr.png [--steps N] [--log]   # lr of every group, torch and JAX overlaid

Kinds are a registry: any module `conformance.cli.<name>` that defines `add_plot_parser(plots)`
adds its kind to `twinstep plot` (it calls `plots.add_parser(KIND, ...)` and sets `run` on it;
`schedule.py` adds `schedule`), so a later module adds `twinstep plot metrics` without editing
this file. Until one does, `twinstep plot metrics` says that it is not available yet.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import Any

from conformance.errors import UnsupportedError

PLANNED = {"metrics": "needs the trainer's metrics.jsonl (twinstep train); it is not available yet"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="draw figures: schedule (lr per update, torch and JAX overlaid), ...",
                       description="Draw a figure to a PNG (or any format matplotlib writes).")
    plots = p.add_subparsers(dest="plot_kind", metavar="KIND")
    p.set_defaults(run=lambda args: _no_kind(p))
    registered = register_plots(plots)
    for kind, why in PLANNED.items():
        if kind not in registered:
            q = plots.add_parser(kind, help=f"(not available yet) {why}", add_help=True)
            q.add_argument("rest", nargs=argparse.REMAINDER)
            q.set_defaults(run=lambda args, kind=kind, why=why: _unavailable(kind, why))


def register_plots(plots: Any) -> list[str]:
    """Let every cli module that defines `add_plot_parser(plots)` add its kind; return the kinds."""
    import conformance.cli as cli

    before = set(plots.choices)
    for info in sorted(pkgutil.iter_modules(cli.__path__), key=lambda m: m.name):
        if info.name in ("plot",) or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"conformance.cli.{info.name}")
        hook = getattr(module, "add_plot_parser", None)
        if hook is not None:
            hook(plots)
    return sorted(set(plots.choices) - before)


def _no_kind(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _unavailable(kind: str, why: str) -> int:
    raise UnsupportedError(f"twinstep plot {kind} {why}")
