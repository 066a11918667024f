"""`twinstep schedule CONFIG`: the learning rate a config's schedule gives every update, in short.

    twinstep schedule run.toml [--steps N] [--updates-per-epoch N] [--set schedule.t_max=500]
    twinstep schedule plateau.toml --metrics val_losses.txt     # reduce_on_plateau: one value per update

Prints, per parameter group, the first, peak and last lr, then the schedule's milestones (where it
changes phase) with the lr of every group there, then how closely torch, JAX and the oracle agree.
The number of updates comes from `--steps`, else from `planned_updates(config)`, else from the
schedule's own length. `plot.py` draws the same values (`twinstep plot schedule`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from conformance import data
from conformance.config import Config, load_config
from conformance.config.schedule import ScheduleSpec
from conformance.errors import ConfigError, TwinstepError
from conformance.rules.groups import group_base_lrs, group_layout
from conformance.rules.schedules import check_run_length

BACKENDS = ("torch", "jax", "oracle")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("schedule", help="print a config's learning-rate schedule in short",
                       description="Print the first, peak and last lr of every parameter group, the "
                                   "schedule's milestones, and how closely torch, JAX and the oracle agree.")
    add_arguments(p)
    p.add_argument("--backend", choices=[*BACKENDS, "all"], default="all",
                   help="which backends to evaluate (default: all; the table shows the first)")
    p.set_defaults(run=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments `schedule` and `plot schedule` share."""
    p.add_argument("config", nargs="?", help="training config (TOML); default: the built-in default")
    p.add_argument("--steps", type=int, metavar="N", help="number of updates (default: the planned run)")
    p.add_argument("--updates-per-epoch", type=int, metavar="N",
                   help="updates per epoch for unit = 'epoch' (default: from the data settings)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--metrics", metavar="FILE", help="reduce_on_plateau: the metric observed after each update, "
                                                      "numbers separated by spaces, commas or newlines")


def read_metrics(path: str | None, config: Config, steps: int) -> list[float] | None:
    """--metrics FILE as floats (one per update), refused for schedules that observe none."""
    if path is None:
        return None
    if config.schedule.name != "reduce_on_plateau":
        raise ConfigError(f"--metrics is only read by schedule.name = 'reduce_on_plateau'; received it with "
                          f"name = {config.schedule.name!r}")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    words = text.replace(",", " ").split()
    try:
        values = [float(w) for w in words]
    except ValueError:
        bad = next(w for w in words if not _is_float(w))
        raise ConfigError(f"{path}: {bad!r} is not a number (one metric per update)") from None
    if len(values) != steps:
        raise ConfigError(f"{path}: {len(values)} metrics for {steps} updates (one per update; set --steps)")
    return values


def _is_float(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def resolve(args: argparse.Namespace) -> tuple[Config, int, int, str]:
    """(config, steps, updates_per_epoch, where the number of steps came from) for the CLI."""
    config = load_config(args.config, args.set)
    spec = config.schedule
    upe = 1
    if spec.unit == "epoch":
        upe = args.updates_per_epoch or data.updates_per_epoch(config)
        if upe < 1:
            raise ConfigError("schedule.unit = 'epoch' needs the number of updates per epoch: pass "
                              "--updates-per-epoch N")
    elif args.updates_per_epoch not in (None, 1):
        raise ConfigError("--updates-per-epoch is only used with schedule.unit = 'epoch'")
    if args.steps is not None:
        if args.steps < 1:
            raise ConfigError(f"--steps must be >= 1; received {args.steps}")
        return config, args.steps, upe, "--steps"
    return config, data.planned_updates(config), upe, "the planned run"


def group_labels(optimizer: Any) -> list[str]:
    """Labels of the param groups in lr-list order."""
    return [g.label for g in group_layout(optimizer)]


def key_points(spec: ScheduleSpec) -> list[tuple[int, str]]:
    """Schedule steps where the schedule changes phase, with a few words each (unit: spec.unit)."""
    name, pts = spec.name, []
    if name == "step":
        pts = [(spec.step_size * k, f"x gamma = {spec.gamma:g}") for k in range(1, 1000)]
    elif name == "multistep":
        pts = [(m, f"x gamma = {spec.gamma:g}") for m in spec.milestones]
    elif name == "cosine":
        pts = [(spec.t_max * k, "eta_min reached" if k % 2 else "back at the base lr (torch past t_max)")
               for k in range(1, 1000)]
    elif name in ("linear", "polynomial") or (name == "constant" and spec.factor is not None):
        pts = [(spec.total_iters, "ramp ends")]
    elif name == "onecycle":
        pct_end = float(spec.pct_start * spec.total_steps) - 1
        pts = [(int(np.ceil(pct_end)), f"peak phase ends at step {pct_end:g}"),
               (spec.total_steps - 1, "last step: min lr")]
    elif name == "cosine_restarts":
        start, length = 0, spec.t_0
        for _ in range(1000):
            start, length = start + length, length * spec.t_mult
            pts.append((start, "restart"))
    elif name in ("warmup_cosine", "inverse_sqrt", "wsd") and spec.warmup_steps:
        pts = [(spec.warmup_steps, "warm-up ends: peak lr")]
    if name == "warmup_cosine":
        pts.append((spec.total_steps, "eta_min reached" + (" and held" if spec.convention == "optax" else "")))
    elif name == "wsd":
        pts += [(spec.total_steps - spec.decay_steps, f"{spec.decay_type} decay starts"),
                (spec.total_steps, "eta_min reached and held")]
    elif name == "cyclic":
        period = spec.step_size_up + spec.step_size_down
        for k in range(1000):
            pts += [(k * period + spec.step_size_up, "cycle peak"), ((k + 1) * period, "cycle ends")]
    elif name == "tabulated":
        pts = [(len(spec.factors) - 1, f"table ends: x {spec.factors[-1]:g} held")]
    elif name == "chained":
        pts = [(s, f"part {i} ({part.name}): {what}") for i, part in enumerate(spec.schedulers)
               for s, what in key_points(part)]
    elif name == "sequential":
        bounds = [0, *spec.milestones, None]
        for i, part in enumerate(spec.schedulers):
            if i:
                pts.append((bounds[i], f"milestone: part {i} ({part.name}) starts"))
            pts += [(bounds[i] + s, f"part {i}: {what}") for s, what in key_points(part)
                    if s > 0 and (bounds[i + 1] is None or bounds[i] + s < bounds[i + 1])]
    return sorted(p for p in pts if p[0] > 0)


def evaluate(config: Config, steps: int, upe: int, backends: tuple[str, ...],
             metrics: list[float] | None = None) -> dict[str, dict[str, Any]]:
    """schedule_values on each backend (in its numerics context); a backend that cannot be imported
    is reported, not fatal. `metrics`: reduce_on_plateau's observed values, one per update."""
    from conformance.harness.backends import Backend

    out: dict[str, dict[str, Any]] = {}
    for name in backends:
        backend = Backend(name)
        try:
            fn = backend.function("schedules", "schedule_values")
        except (ImportError, TwinstepError) as exc:
            out[name] = {"error": str(exc)}
            continue
        with backend.context():
            out[name] = fn(config.schedule, config.optimizer, steps, upe,
                           **({"metrics": metrics} if metrics is not None else {}))
    return out


def _describe(spec: ScheduleSpec, nested: bool = False) -> str:
    skip = {"name", "schedulers", "hyper"} | ({"unit"} if nested else set())
    options = {k: v for k, v in spec.model_dump(exclude=skip).items()
               if v is not None and not (k == "unit" and v == "update")}
    return ", ".join(f"{k}={v}" for k, v in options.items())


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def print_summary(config: Config, steps: int, upe: int, where: str, values: dict[str, dict[str, Any]],
                  out: TextIO) -> None:
    spec = config.schedule
    shown = next(v for v in values.values() if "lr" in v)
    lr = shown["lr"]
    labels = group_labels(config.optimizer)
    text = _describe(spec)
    if spec.schedulers:
        text += "; parts: " + " | ".join(f"{p.name}({_describe(p, nested=True)})" for p in spec.schedulers)
    if spec.hyper:
        text += "; hyper: " + " | ".join(f"{k} {p.name}({_describe(p, nested=True)})" for k, p in spec.hyper.items())
    out.write(f"schedule: {spec.name}" + (f" ({text})" if text else "") + f"; {steps} updates from {where}"
              + (f", {upe} updates per epoch" if spec.unit == "epoch" else "") + "\n")
    width = max(len(s) for s in [*labels, "group"])
    out.write(f"{'group':<{width}}  {'base lr':>11}  {'first':>11}  {'peak':>11}  {'at update':>9}  {'last':>11}\n")
    for g, label in enumerate(labels):
        col = lr[:, g]
        out.write(f"{label:<{width}}  {_fmt(group_base_lrs(config.optimizer)[g]):>11}  {_fmt(col[0]):>11}  "
                  f"{_fmt(col.max()):>11}  {int(np.argmax(col)):>9}  {_fmt(col[-1]):>11}\n")
    points = [(s * upe, what) for s, what in key_points(spec) if s * upe < steps]
    if points:
        out.write("milestones:\n")
        for t, what in points[:12]:
            lrs = " / ".join(_fmt(x) for x in lr[t])
            out.write(f"  update {t:>7}  {what:<40}  lr {lrs}\n")
        if len(points) > 12:
            out.write(f"  ... {len(points) - 12} more\n")
    if shown.get("momentum") is not None:
        m = shown["momentum"][:, 0]
        out.write(f"{shown['momentum_name']} cycles: first {_fmt(m[0])}, lowest {_fmt(m.min())} at update "
                  f"{int(np.argmin(m))}, last {_fmt(m[-1])}\n")
    for key, table in (shown.get("hyper") or {}).items():  # [schedule.hyper]: the groups that read the key
        parts = [f"{label} {_fmt(table[0, g])} → {_fmt(table[-1, g])} (lowest {_fmt(np.min(table[:, g]))}, "
                 f"highest {_fmt(np.max(table[:, g]))})" for g, label in enumerate(labels) if not np.isnan(table[0, g])]
        out.write(f"{key}: " + "; ".join(parts) + "\n")
    _print_agreement(values, out)


def _print_agreement(values: dict[str, dict[str, Any]], out: TextIO) -> None:
    ok = {k: v for k, v in values.items() if "lr" in v}
    for name, v in values.items():
        if "error" in v:
            out.write(f"{name}: not evaluated ({v['error']})\n")
    if len(ok) > 1:
        ref_name, ref = next(iter(ok.items()))
        diffs = [f"{name} {np.abs(v['lr'] - ref['lr']).max():.1e}" for name, v in ok.items() if name != ref_name]
        out.write(f"max |lr - {ref_name} lr|: " + ", ".join(diffs) + "\n")
        for key, table in (ref.get("hyper") or {}).items():
            diffs = [f"{name} {np.nanmax(np.abs(v['hyper'][key] - table)):.1e}" for name, v in ok.items()
                     if name != ref_name]
            out.write(f"max |{key} - {ref_name} {key}|: " + ", ".join(diffs) + "\n")


def run(args: argparse.Namespace) -> int:
    config, steps, upe, where = resolve(args)
    notes = _notes(config, steps, upe, strict=where != "--steps", metrics=args.metrics)
    backends = BACKENDS if args.backend == "all" else (args.backend,)
    metrics = read_metrics(args.metrics, config, steps)
    values = evaluate(config, steps, upe, backends, metrics)
    if not any("lr" in v for v in values.values()):
        raise ConfigError("; ".join(f"{k}: {v['error']}" for k, v in values.items()))
    print_summary(config, steps, upe, where, values, sys.stdout)
    for note in notes:
        print(f"note: {note}")
    return 0


def _notes(config: Config, steps: int, upe: int, strict: bool, metrics: Any = None) -> list[str]:
    plateau = ["reduce_on_plateau moves only on observed metrics: without --metrics every lr holds"] \
        if config.schedule.name == "reduce_on_plateau" and metrics is None else []
    try:
        return plateau + check_run_length(config.schedule, steps, upe)
    except ConfigError as exc:
        if strict:
            raise
        return plateau + [str(exc)]


# ----------------------------------------------------------------------------------------------
# twinstep plot schedule (registered with plot.py's registry)
# ----------------------------------------------------------------------------------------------


def add_plot_parser(plots: Any) -> None:
    """Register `twinstep plot schedule` (see conformance/cli/plot.py)."""
    q = plots.add_parser("schedule", help="lr of every param group against the update, torch and JAX overlaid",
                         description="Draw the lr (and onecycle's / cyclic's cycled momentum, and every "
                                     "[schedule.hyper] hyper-parameter) of every parameter group against the "
                                     "update count, torch and JAX overlaid.")
    add_arguments(q)
    q.add_argument("-o", "--output", required=True, metavar="PATH", help="image file to write (e.g. lr.png)")
    q.add_argument("--log", action="store_true", help="logarithmic lr axis")
    q.set_defaults(run=run_schedule_plot)


def run_schedule_plot(args: argparse.Namespace) -> int:
    """Write the figure: lr (and cycled momentum) of every group vs update, torch and JAX overlaid."""
    config, steps, upe, where = resolve(args)
    notes = _notes(config, steps, upe, strict=where != "--steps", metrics=args.metrics)
    values = evaluate(config, steps, upe, ("torch", "jax"), read_metrics(args.metrics, config, steps))
    missing = [f"{k}: {v['error']}" for k, v in values.items() if "error" in v]
    if missing:
        raise ConfigError("plot schedule overlays torch and JAX; " + "; ".join(missing))
    out = Path(args.output)
    if not out.parent.exists():
        raise ConfigError(f"{out}: the folder {out.parent} does not exist")
    points = [s * upe for s, _ in key_points(config.schedule) if s * upe < steps]
    draw_schedule(values, group_labels(config.optimizer), points, config.schedule.name, where, args.log, out)
    print(f"wrote {out} ({steps} updates, {len(group_labels(config.optimizer))} group(s), torch and jax)")
    for note in notes:
        print(f"note: {note}")
    return 0


def draw_schedule(values: dict[str, dict[str, Any]], labels: list[str], points: list[int], name: str,
                  where: str, log: bool, out: Path) -> None:
    """lr per group vs update: torch as solid lines, JAX dashed on top; milestones as faint lines."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only, never a window
    import matplotlib.pyplot as plt
    import numpy as np

    def column(backend: str, key: str) -> Any:  # a [schedule.hyper] key's table, or the lr / momentum
        v = values[backend]
        return v["hyper"][key] if key in (v.get("hyper") or {}) else v[key]

    panels = [("lr", "learning rate")]
    if values["torch"].get("momentum") is not None:
        panels.append(("momentum", values["torch"]["momentum_name"]))
    panels += [(key, key) for key in values["torch"].get("hyper") or {}]  # NaN (groups not reading it): not drawn
    rows = len(panels)
    fig, axes = plt.subplots(rows, 1, figsize=(8, 3.2 * rows + 0.6), sharex=True, squeeze=False)
    steps = values["torch"]["lr"].shape[0]
    t = np.arange(steps)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, ylabel) in zip(axes[:, 0], panels):
        for g, label in enumerate(labels):
            color = colors[g % len(colors)]
            ax.plot(t, column("torch", key)[:, g], color=color, lw=2.2, alpha=0.6, label=f"{label} (torch)")
            ax.plot(t, column("jax", key)[:, g], color="black", lw=0.9, ls="--", label=f"{label} (jax)")
        for p in points:
            ax.axvline(p, color="0.8", lw=0.8, zorder=0)
        ax.set_ylabel(ylabel)
        if log and key == "lr":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    diff = max(float(np.abs(values["torch"]["lr"] - values["jax"]["lr"]).max()), 0.0)
    axes[0, 0].set_title(f"{name}: {steps} updates ({where}); max |torch - jax| = {diff:.1e}")
    axes[0, 0].legend(fontsize=8, ncol=2)
    axes[-1, 0].set_xlabel("update t (the value is the lr update t applies)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
