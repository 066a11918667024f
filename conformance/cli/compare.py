"""`twinstep compare DIR_A DIR_B`: do two runs agree update by update? (conformance/run/compare.py)

    twinstep compare runs/torch runs/jax                 # summary: first divergence, worst update, verdict
    twinstep compare runs/torch runs/jax --rtol 1e-6 --atol 0 --plot curves.png --all

A is the reference (the torch run, by convention). Prints the largest relative difference per field,
the update that uses the most of the tolerance, the first update beyond tolerance and the verdict;
`--all` first prints one line per update (loss of both runs, relative differences of loss, lr and
grad_norm, skipped/loss scale of both). Runs of different lengths are compared over the updates
both have, with a note saying so; a run missing an update inside the other's range is a problem. Exit status: 0 when every
compared value is within tolerance, 1 when not, 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

from conformance.errors import ConfigError
from conformance.rules.tolerance import Tolerance
from conformance.run.compare import (
    RunComparison,
    UpdateDiff,
    compare_runs,
    describe_failure,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="compare two training runs update by update (loss, lr, grad norm, skips)",
                       description="Compare run B against reference run A (their metrics.jsonl): loss, lr and "
                                   "grad_norm within tolerance, skipped and loss_scale exactly. Exit 1 beyond "
                                   "tolerance.")
    p.add_argument("dir_a", metavar="DIR_A", help="reference run directory (e.g. the torch run)")
    p.add_argument("dir_b", metavar="DIR_B", help="run directory to check (e.g. the JAX run)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default: by the runs' precision.dtype)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default: by the runs' precision.dtype)")
    p.add_argument("--plot", metavar="PNG", help="draw both runs' curves and their relative differences")
    p.add_argument("--all", action="store_true", help="print every update's line before the summary")
    p.add_argument("--quiet", action="store_true", help="the summary only (the default; kept for scripts)")
    p.set_defaults(run=run)


def _tolerance(args: argparse.Namespace) -> Tolerance | None:
    for name in ("rtol", "atol"):
        value = getattr(args, name)
        if value is not None and not (value >= 0 and value != float("inf")):
            raise ConfigError(f"--{name} must be a finite number >= 0; received {value}")
    if args.rtol is None and args.atol is None:
        return None
    return Tolerance(args.atol if args.atol is not None else 0.0, args.rtol if args.rtol is not None else 0.0)


def _rel(x: float | None) -> str:
    return "       -" if x is None else f"{x:8.1e}"


def _num(x: Any) -> str:
    if x is None:
        return f"{'-':>12}"
    return f"{x:12.6g}" if isinstance(x, float) else f"{str(x):>12}"


def print_table(result: RunComparison, out: TextIO) -> None:
    """One line per update: losses, relative differences, skip flags and loss scales; `!` marks a
    line beyond tolerance."""
    out.write(f"{'update':>7} {'loss A':>12} {'loss B':>12} {'rel loss':>8} {'rel lr':>8} {'rel gnorm':>9}"
              f" {'skip A/B':>8} {'scale A/B':>19}\n")
    evals = {r.update: r for r in result.evals}
    for row in result.rows:
        skip = f"{int(bool(row.a.get('skipped')))}/{int(bool(row.b.get('skipped')))}"
        scale = f"{_num(row.a.get('loss_scale')).strip()}/{_num(row.b.get('loss_scale')).strip()}"
        mark = " !" + ",".join(row.failed) if row.failed else ""
        out.write(f"{row.update:>7} {_num(row.a.get('loss'))} {_num(row.b.get('loss'))} {_rel(row.rel.get('loss'))} "
                  f"{_rel(row.rel.get('lr'))} {_rel(row.rel.get('grad_norm'))} {skip:>9} {scale:>19}{mark}\n")
        ev = evals.get(row.update)
        if ev is not None:
            mark = " !" if ev.failed else ""
            out.write(f"{'eval':>7} {_num(ev.a.get('val_loss'))} {_num(ev.b.get('val_loss'))} "
                      f"{_rel(ev.rel.get('val_loss'))}{mark}\n")


def print_summary(result: RunComparison, out: TextIO) -> None:
    tol = result.tolerance
    for note in result.notes:
        out.write(f"note: {note}\n")
    for problem in result.problems:
        out.write(f"problem: {problem}\n")
    n = len(result.rows)
    worst = ", ".join(f"{k} {v:.2e}" for k, v in sorted(result.max_rel.items())) or "none"
    out.write(f"{n} updates, {len(result.evals)} evaluations compared; largest relative difference: {worst}; "
              f"{100 * result.max_usage:.3g}% of the tolerance used at most\n")
    top = result.worst
    if top is not None:
        kind = "evaluation at update" if any(top is e for e in result.evals) else "update"
        out.write(f"worst: {kind} {top.update} ({100 * top.usage:.3g}% of the tolerance)\n")
    first: UpdateDiff | None = result.first_failure
    if first is None and not result.problems:
        out.write(f"PASS: every value within rtol {tol.rtol:g}, atol {tol.atol:g}; skips and loss scales equal\n")
    elif first is not None:
        out.write(f"FAIL: first beyond rtol {tol.rtol:g}, atol {tol.atol:g} at {describe_failure(first)}\n")
    else:
        out.write("FAIL: the runs do not cover the same updates\n")


def run(args: argparse.Namespace) -> int:
    result = compare_runs(args.dir_a, args.dir_b, _tolerance(args), shared=True)
    out = sys.stdout
    if args.all and not args.quiet:
        print_table(result, out)
    print_summary(result, out)
    if args.plot:
        plot(result, Path(args.plot))
        out.write(f"plot written to {args.plot}\n")
    return 0 if result.passed else 1


def plot(result: RunComparison, path: Path) -> None:
    """Loss and lr of both runs, and the relative differences per update against the tolerance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ups = [r.update for r in result.rows]
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for label, side, style in (("A", "a", "-"), ("B", "b", "--")):
        axes[0].plot(ups, [_plain(getattr(r, side).get("loss")) for r in result.rows], style, label=f"loss {label}")
        axes[1].plot(ups, [_plain((getattr(r, side).get("lr") or [None])[0]) for r in result.rows], style,
                     label=f"lr (group 0) {label}")
    skipped = [r.update for r in result.rows if r.a.get("skipped") or r.b.get("skipped")]
    for u in skipped:
        axes[0].axvline(u, color="0.85", lw=0.8)
    axes[2].set_yscale("log")
    for name in ("loss", "lr", "grad_norm"):
        # exact agreement (0) has no place on a log axis: it is left out, as are non-finite values
        values = [r.rel.get(name) or float("nan") for r in result.rows]
        if any(v == v for v in values):
            axes[2].plot(ups, values, ".", label=f"rel {name}")
    axes[2].axhline(result.tolerance.rtol, color="r", lw=0.8, label=f"rtol {result.tolerance.rtol:g}")
    first = result.first_failure
    if first is not None:
        for ax in axes:
            ax.axvline(first.update, color="r", ls=":", lw=1)
    for ax in axes:
        ax.legend(fontsize=8)
    axes[2].set_xlabel("update")
    fig.suptitle("twinstep compare: A (reference) vs B")
    with warnings.catch_warnings():  # a constant curve (a constant lr) is a flat line, not a problem
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _plain(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")
