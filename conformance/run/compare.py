"""Compare two training runs update by update: `twinstep compare DIR_A DIR_B` (cli/compare.py).

Run A is the reference (by convention the torch run: the production path). For every update both
runs logged, the metrics lines (docs/contract.md §5) must agree:

- `loss`, every group's `lr`, `grad_norm` and, at evaluations, `val_loss`: within tolerance,
  |b − a| <= atol + rtol·|a|; a non-finite value matches only the same non-finite value (an
  injected overflow logs loss +inf and grad_norm null on both sides);
- `skipped`, `loss_scale`, `epoch`, `samples_seen`: exactly (the same data, the same decisions).

The default tolerance comes from the runs' [precision] dtype (conformance.rules.tolerance, scope
"run"; the looser one if the two differ). The float64 bound is the issue's 1e-10 relative; the float32 and low-precision
bounds are measured on the bundled configs and pinned by tests/test_cross_framework.py, see
docs/jax_trainer.md. Tolerances are per update and do not grow with t: a run that drifts apart
fails where it leaves the band, which is the update `first_failure` names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance import tomlio
from conformance.config import MAX_CONFIG_BYTES
from conformance.errors import TwinstepError
from conformance.files import read_regular
from conformance.rules.tolerance import (
    TOLERANCES,
    Tolerance,
    default_tolerance,
    loosest,
)
from conformance.run.metrics import evals, read_metrics, updates

FIELDS: tuple[str, ...] = ("loss", "lr", "grad_norm")
EXACT: tuple[str, ...] = ("skipped", "loss_scale", "epoch", "samples_seen")


@dataclass
class UpdateDiff:
    """One update's differences: relative error per field (None where not comparable), and the
    fields beyond tolerance or not equal."""

    update: int
    a: dict[str, Any]
    b: dict[str, Any]
    rel: dict[str, float | None]
    failed: list[str] = field(default_factory=list)
    usage: float = 0.0  # the largest |b − a| / (atol + rtol·|a|) of the line: 1.0 is the tolerance


@dataclass
class RunComparison:
    """The result of compare_runs: per-update and per-evaluation differences, the largest relative
    error per field, the first failing update, and notes (config differences)."""

    tolerance: Tolerance
    rows: list[UpdateDiff]
    evals: list[UpdateDiff]
    max_rel: dict[str, float]
    problems: list[str]
    notes: list[str]

    @property
    def max_usage(self) -> float:
        """How much of the tolerance the worst value uses (|b − a| / (atol + rtol·|a|); > 1 fails)."""
        return max((r.usage for r in self.rows + self.evals), default=0.0)

    @property
    def passed(self) -> bool:
        return not self.problems and all(not r.failed for r in self.rows + self.evals)

    @property
    def worst(self) -> UpdateDiff | None:
        """The update (or evaluation) that uses the most of the tolerance."""
        return max(self.rows + self.evals, key=lambda r: r.usage, default=None)

    @property
    def first_failure(self) -> UpdateDiff | None:
        bad = [r for r in self.rows + self.evals if r.failed]
        return min(bad, key=lambda r: (r.update, r in self.evals)) if bad else None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def close(a: Any, b: Any, tol: Tolerance) -> tuple[bool, float | None, float]:
    """(within tolerance, relative error, share of the tolerance used) of one number against the
    reference `a`. None/NaN/±inf must match exactly (None for None, NaN for NaN, the same infinity)."""
    if not (_finite(a) and _finite(b)):
        same = (a is None and b is None) or (
            isinstance(a, float) and isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b))))
        return same, None, 0.0 if same else math.inf
    diff = abs(b - a)
    rel = diff / abs(a) if a != 0 else (0.0 if diff == 0 else math.inf)
    bound = tol.atol + tol.rtol * abs(a)
    usage = diff / bound if bound > 0 else (0.0 if diff == 0 else math.inf)
    return diff <= bound, rel, usage


def _compare_line(u: int, a: dict[str, Any], b: dict[str, Any], tol: Tolerance,
                  fields: tuple[str, ...], exact: tuple[str, ...]) -> UpdateDiff:
    row = UpdateDiff(u, a, b, {})
    for name in fields:
        va, vb = a.get(name), b.get(name)
        if isinstance(va, list) or isinstance(vb, list):
            va, vb = list(va or []), list(vb or [])
            if len(va) != len(vb):
                row.failed.append(name)
                row.rel[name] = None
                continue
            checks = [close(x, y, tol) for x, y in zip(va, vb)]
            rels = [r for _, r, _ in checks if r is not None]
            row.rel[name] = max(rels) if rels else None
            row.usage = max([row.usage, *(u for _, _, u in checks)])
            if not all(ok for ok, _, _ in checks):
                row.failed.append(name)
            continue
        ok, row.rel[name], usage = close(va, vb, tol)
        row.usage = max(row.usage, usage)
        if not ok:
            row.failed.append(name)
    for name in exact:
        if a.get(name) != b.get(name):
            row.failed.append(name)
    return row


def read_run(directory: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(metrics records, resolved config) of a run directory; TwinstepError names what is missing."""
    path = Path(directory)
    if not path.is_dir():
        raise TwinstepError(f"{path}: no such run directory")
    records = read_metrics(path / "metrics.jsonl")
    if not (path / "config.toml").exists() and not (path / "config.toml").is_symlink():
        return records, {}
    # a FIFO or a device there is refused at once, never read (conformance.files)
    text = read_regular(path / "config.toml", MAX_CONFIG_BYTES, what="config").decode("utf-8", "replace")
    return records, tomlio.parse(text, str(path / "config.toml"), TwinstepError)


def run_tolerance(config_a: dict[str, Any], config_b: dict[str, Any]) -> Tolerance:
    """The looser of the two runs' dtype tolerances (float32 when a config says nothing)."""
    dtypes = [(c.get("precision") or {}).get("dtype", "float32") for c in (config_a, config_b)]
    return loosest([default_tolerance(d if d in TOLERANCES else "float32", "run") for d in dtypes])


# Fields that may differ without changing the trajectory (where it runs and how it reports).
NEUTRAL_FIELDS = ("run.device", "run.log_every", "run.progress", "run.tensorboard", "run.loggers", "run.compile",
                  "run.deterministic", "run.parallel", "checkpoint.")


def config_notes(config_a: dict[str, Any], config_b: dict[str, Any]) -> list[str]:
    """One note per config field that differs and could change the trajectory."""
    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    fa, fb = flat(config_a), flat(config_b)
    keys = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k) and not k.startswith(NEUTRAL_FIELDS))
    return [f"configs differ: {k} = {fa.get(k)!r} in A, {fb.get(k)!r} in B" for k in keys]


def compare_runs(dir_a: str | Path, dir_b: str | Path, tolerance: Tolerance | None = None,
                 shared: bool = False) -> RunComparison:
    """Compare run B against the reference run A (see the module docstring). Updates one run has and
    the other lacks are problems (the comparison fails), except with `shared` where one run simply
    ends earlier: then the updates both have are compared, with a note saying so (`twinstep
    compare`)."""
    rec_a, cfg_a = read_run(dir_a)
    rec_b, cfg_b = read_run(dir_b)
    tol = tolerance or run_tolerance(cfg_a, cfg_b)
    ua = {int(r["update"]): r for r in updates(rec_a)}
    ub = {int(r["update"]): r for r in updates(rec_b)}
    problems = []
    if not ua or not ub:
        problems.append(f"run {'A' if not ua else 'B'} has no update lines in metrics.jsonl")
    only_a, only_b = sorted(ua.keys() - ub.keys()), sorted(ub.keys() - ua.keys())
    notes = config_notes(cfg_a, cfg_b)
    for short, long, only, theirs in (("B", "A", only_a, ub), ("A", "B", only_b, ua)):
        if shared and only and theirs and only[0] > max(theirs):  # one run is shorter: compare what both have
            notes.append(f"run {short} ends after update {max(theirs)}: compared the {len(theirs)} updates both runs "
                         f"have ({len(only)} more in run {long})")
        elif only:
            problems.append(f"run {short} has no line for update {only[0]} ({len(only)} updates of {long} are "
                            f"missing in {short})")
    rows = [_compare_line(u, ua[u], ub[u], tol, FIELDS, EXACT) for u in sorted(ua.keys() & ub.keys())]
    ea = {int(r["update"]): r for r in evals(rec_a)}
    eb = {int(r["update"]): r for r in evals(rec_b)}
    for name, only in (("A", sorted(ea.keys() - eb.keys())), ("B", sorted(eb.keys() - ea.keys()))):
        if only:  # e.g. the end-of-run evaluation of a run that was later resumed for longer
            notes.append(f"evaluations only in run {name}, not compared: after updates {only[:8]}")
    ev = [_compare_line(u, ea[u], eb[u], tol, ("val_loss",), ()) for u in sorted(ea.keys() & eb.keys())]
    max_rel: dict[str, float] = {}
    for r in rows + ev:
        for k, v in r.rel.items():
            if v is not None:
                max_rel[k] = max(max_rel.get(k, 0.0), v)
    return RunComparison(tol, rows, ev, max_rel, problems, notes)


def _fmt(x: Any) -> str:
    if isinstance(x, list):
        return "[" + ", ".join(_fmt(v) for v in x) + "]"
    if isinstance(x, float):
        return repr(x)  # the shortest text that reads back as the same double
    return "null" if x is None else str(x)


def describe_failure(row: UpdateDiff) -> str:
    """One line: which fields of which update differ, with both values."""
    parts = []
    for name in row.failed:
        rel = row.rel.get(name)
        extra = f" (rel {rel:.2e})" if rel is not None else ""
        parts.append(f"{name} {_fmt(row.a.get(name))} vs {_fmt(row.b.get(name))}{extra}")
    kind = "evaluation at update" if "val_loss" in row.rel else "update"
    return f"{kind} {row.update}: " + "; ".join(parts)
