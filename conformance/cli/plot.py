"""`twinstep plot KIND ...`: figures (matplotlib, Agg backend: no display needed).

    twinstep plot schedule run.toml -o lr.png [--steps N] [--log]   # lr of every group, torch and JAX overlaid

Kinds are a registry: any module `conformance.cli.<name>` that defines `add_plot_parser(plots)`
adds its kind to `twinstep plot` (it calls `plots.add_parser(KIND, ...)` and sets `run` on it;
`schedule.py` adds `schedule`, `metrics_plot.py` adds `metrics`), so a new kind needs no edit here.

    twinstep plot metrics runs/torch runs/jax -o curves.png        # loss, lr, grad norm, loss scale
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="draw figures: schedule (lr per update, torch and JAX overlaid), ...",
                       description="Draw a figure to a PNG (or any format matplotlib writes).")
    plots = p.add_subparsers(dest="plot_kind", metavar="KIND")
    p.set_defaults(run=lambda args: _no_kind(p))
    register_plots(plots)


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
