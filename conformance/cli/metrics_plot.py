"""`twinstep plot metrics DIR -o curves.png`: training curves from a run's metrics.jsonl.

Four panels against the update: training loss (and validation loss at its evaluations), the lr of
every parameter group (log scale), the gradient norm before clipping (log scale), and the loss scale
with skipped updates marked. Several run directories can be overlaid (e.g. a torch and a JAX run of
the same config). Registered with `twinstep plot` through conformance/cli/plot.py's registry.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from conformance.errors import ConfigError, TwinstepError
from conformance.run.metrics import evals, read_metrics, updates


def add_plot_parser(plots: Any) -> None:
    """Register `twinstep plot metrics` (see conformance/cli/plot.py)."""
    q = plots.add_parser("metrics", help="loss, val loss, lr, grad norm and loss scale of training runs",
                         description="Draw the curves of one or more run directories (each with a metrics.jsonl "
                                     "written by twinstep train) against the update.")
    q.add_argument("runs", nargs="+", metavar="DIR", help="run directories (or metrics.jsonl files)")
    q.add_argument("-o", "--output", required=True, metavar="PATH", help="image file to write (e.g. curves.png)")
    q.set_defaults(run=run_metrics_plot)


def _metrics_file(path: str) -> Path:
    p = Path(path)
    f = p / "metrics.jsonl" if p.is_dir() else p
    if not f.is_file():
        raise TwinstepError(f"{f}: no such metrics file (run twinstep train --out {path} first)")
    return f


def run_metrics_plot(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if not out.parent.exists():
        raise ConfigError(f"{out}: the folder {out.parent} does not exist")
    runs = {}
    for path in args.runs:
        records = read_metrics(_metrics_file(path))
        if not updates(records):
            raise TwinstepError(f"{_metrics_file(path)} has no update records yet")
        runs[path] = records
    draw(runs, out)
    n = max(len(updates(r)) for r in runs.values())
    print(f"wrote {out} ({len(runs)} run(s), up to {n} updates)")
    return 0


def _finite(xs: list[Any]) -> list[float]:
    return [float(x) if isinstance(x, (int, float)) and math.isfinite(x) else math.nan for x in xs]


def draw(runs: dict[str, list[dict[str, Any]]], out: Path) -> None:
    """loss / val loss, lr per group, grad norm, loss scale (skips marked) vs update, one colour per run."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only, never a window
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    (ax_loss, ax_lr), (ax_norm, ax_scale) = axes
    for i, (label, records) in enumerate(runs.items()):
        colour = f"C{i}"
        ups, evs = updates(records), evals(records)
        t = [r["update"] for r in ups]
        ax_loss.plot(t, _finite([r["loss"] for r in ups]), color=colour, lw=0.9, label=f"{label} train")
        if evs:
            ax_loss.plot([r["update"] for r in evs], _finite([r["val_loss"] for r in evs]), "o--", color=colour,
                         ms=3, label=f"{label} val")
        groups = len(ups[0].get("lr") or [])
        for g in range(groups):
            ax_lr.plot(t, [r["lr"][g] for r in ups], color=colour, lw=1, ls=("-", "--", ":", "-.")[g % 4],
                       label=f"{label} group {g}" if groups > 1 else label)
        ax_norm.plot(t, _finite([r.get("grad_norm") for r in ups]), color=colour, lw=0.8, label=label)
        scales = _finite([r.get("loss_scale") for r in ups])
        if any(not math.isnan(s) for s in scales):
            ax_scale.step(t, scales, where="post", color=colour, label=label)
        skipped = [(r["update"], s if s == s else 1.0) for r, s in zip(ups, scales) if r.get("skipped")]
        if skipped:  # marked at the scale in force when the update was skipped
            ax_scale.plot(*zip(*skipped), "x", color=colour, label=f"{label} skipped")
    ax_loss.set_title("loss (train per update, val at evaluations)")
    ax_lr.set_title("learning rate")
    ax_norm.set_title("gradient norm before clipping")
    ax_scale.set_title("loss scale (x: skipped updates)")
    for ax in (ax_lr, ax_norm, ax_scale):
        if ax.lines and all(min((y for y in line.get_ydata() if y == y), default=1) > 0 for line in ax.lines):
            ax.set_yscale("log")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not recorded (no dynamic loss scaling)" if ax is ax_scale else "no data",
                    ha="center", va="center", transform=ax.transAxes, color="grey")
    for ax in axes[1]:
        ax.set_xlabel("update")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
