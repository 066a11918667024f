"""The drift envelope (`twinstep drift`): do the torch and JAX runs of a config differ by more than
rounding explains? (docs/drift.md has the derivation and the measurements)

From one config at one precision, every run on the same data in the same order:

- the twins: the torch trainer and the JAX trainer from the same initial weights (the config's
  seeded initialization, rounded to the master-weight dtype);
- the self-runs: for each seed k = 1..K and each framework, that framework again with half of the
  initial weights' entries (drawn from k) one ulp up or down (drawn too) and the lr one ulp up (odd
  k) or down (even k): `nudge_weights`, `nudge_lr`;
- the exact runs: each framework's config in float64 from the same start, skipping what its twin
  skipped (`exact_overrides`): a twin's distance from it, E(t), is that twin's own rounding error.

The distance of two runs after update t is ‖w_a(t) − w_b(t)‖ / ‖w_a(t)‖ over every parameter, at
the checkpoints the runs save. The floor F(t) is the larger of the self-runs' largest distance from
their own framework's twin (how far a rounding-sized change carries one framework: it dominates
where the dynamics amplify differences) and √(E_torch² + E_jax²) (how far apart two independent
rounding errors of the twins' sizes put them: a self-run repeats most of its twin's rounding
errors, so where the dynamics do not amplify differences the self-runs alone undercount). The twins
are inside the envelope when D(t) ≤ MULTIPLE · F(t) at every saved update: by the triangle
inequality twins computing the same mathematics stay within √2 · √(E_torch² + E_jax²) plus the
distance of their float64 runs. Also reported: the self-runs' `spread` (each over the largest of
the others) and the twins' `accuracy` ratio (max over min of E_torch, E_jax: a side that rounds
more shows there even while inside). Losses are compared per update too, but the verdict is the
weights': a logged loss is rounded to the compute dtype, so its differences come in steps of its ulp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from conformance.checkpoint.format import list_checkpoints
from conformance.checkpoint.load import load_checkpoint
from conformance.config import Config
from conformance.errors import TwinstepError
from conformance.run.metrics import read_metrics, updates

MULTIPLE = 2.0  # the twins may be this many times the floor (docs/drift.md derives it)
FRAMEWORKS = ("torch", "jax")


def master_dtype(config: Config) -> np.dtype:
    """The dtype of the weights the optimizer updates: float64 for float64 runs, else float32."""
    return np.dtype(np.float64 if config.precision.dtype == "float64" else np.float32)


def nudge_weights(weights: Mapping[str, np.ndarray], seed: int, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Half of the entries (drawn from `seed`) one ulp of `dtype` up or down (drawn too); the rest as
    they are. `weights` must hold values of `dtype` (see master_dtype)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, w in weights.items():
        w = np.asarray(w, dtype)
        moved = rng.random(w.shape) < 0.5
        up = rng.random(w.shape) < 0.5
        step = np.where(up, np.nextafter(w, dtype.type(np.inf)), np.nextafter(w, dtype.type(-np.inf)))
        out[name] = np.where(moved, step, w).astype(dtype)
    return out


def nudge_lr(lr: float, seed: int, dtype: np.dtype) -> float:
    """`lr` one ulp of `dtype` away: up for odd seeds, down for even ones."""
    value = dtype.type(lr)
    return float(np.nextafter(value, dtype.type(np.inf if seed % 2 else -np.inf)))


def exact_overrides(config: Config, skipped: Sequence[int]) -> list[str]:
    """--set overrides that make `config`'s run the float64 one: the same loss scaling (a power of two,
    exact in float64), no TF32, and the updates the low-precision run skipped skipped too."""
    sets = ['precision.dtype="float64"', "precision.allow_tf32=false", f"run.inject_nonfinite={list(skipped)}"]
    if config.precision.dynamic_scaling:
        sets.append('precision.loss_scale="dynamic"')
    return sets


def skipped_updates(run_dir: Path) -> list[int]:
    """The updates a finished run skipped (non-finite gradients)."""
    return [int(r["update"]) for r in updates(read_metrics(run_dir / "metrics.jsonl")) if r.get("skipped")]


def relative_distance(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    """‖a − b‖ / ‖a‖ over every tensor of `a` (float64 sums, in the tensors' name order)."""
    if a.keys() != b.keys():
        raise TwinstepError(f"the runs hold different parameters: {sorted(a.keys() ^ b.keys())[:4]}")
    names = sorted(a)  # one summation order, whatever order the checkpoints listed their tensors in
    num = sum(float(np.sum((np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)) ** 2)) for k in names)
    den = sum(float(np.sum(np.asarray(a[k], np.float64) ** 2)) for k in names)
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))


class Envelope(NamedTuple):
    """The measured envelope (see the module docstring). Lists run over `updates`."""

    updates: list[int]  # updates done at each saved point
    twins: list[float]  # D(t): torch against JAX
    floor: list[float]  # F(t): the larger of the self-runs' largest distance and `rounding`
    selves: dict[str, list[float]]  # each self-run's distance from its framework's twin
    exact: dict[str, list[float]]  # E(t): each twin's distance from its float64 run (empty for float64 runs)
    rounding: list[float]  # √(E_torch² + E_jax²), zeros without exact runs
    ratio: list[float]  # D(t) / F(t)
    spread: float  # the largest self-run distance over the largest of the other self-runs
    accuracy: float  # the largest max(E_torch, E_jax) / min(E_torch, E_jax) (1 without exact runs)
    loss_twins: list[float]  # per update: |L_torch − L_jax| / |L_torch|
    loss_floor: list[float]  # per update: the largest such difference of a self-run from its twin

    @property
    def worst(self) -> int:
        """The index of the largest ratio."""
        return int(np.argmax(self.ratio))

    @property
    def inside(self) -> bool:
        return max(self.ratio) <= MULTIPLE


def saved_weights(run_dir: Path) -> dict[int, dict[str, np.ndarray]]:
    """{updates done: model weights} of every checkpoint a run saved."""
    return {u: load_checkpoint(p).state.model for u, p in sorted(list_checkpoints(run_dir / "checkpoints"))}


def _losses(run_dir: Path) -> np.ndarray:
    return np.array([float(r["loss"]) for r in updates(read_metrics(run_dir / "metrics.jsonl"))])


def _loss_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = min(len(a), len(b))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(a[:n] - b[:n]) / np.abs(a[:n])


def measure(twins: Mapping[str, Path], selves: Mapping[str, Sequence[Path]],
            exact: Mapping[str, Path] | None = None) -> Envelope:
    """The envelope of finished runs: `twins` and `exact` {framework: run dir}, `selves` {framework:
    [run dir per seed]}; every run saved checkpoints at the same updates. The two frameworks may be
    any pair (named by the keys of `twins`, in that order)."""
    if len(twins) != 2:
        raise TwinstepError(f"the envelope compares two twins; received {len(twins)} ({', '.join(twins)})")
    first, second = twins
    weights = {fw: saved_weights(d) for fw, d in twins.items()}
    points = sorted(set.intersection(*(set(w) for w in weights.values())) - {0})
    if not points:
        raise TwinstepError(f"the runs in {Path(next(iter(twins.values()))).parent} saved no checkpoint in common")
    twin_d = _distances(weights[first], weights[second], points)
    self_d: dict[str, list[float]] = {}
    loss_base = {fw: _losses(d) for fw, d in twins.items()}
    loss_self = []
    for fw, dirs in selves.items():
        for k, d in enumerate(dirs, 1):
            self_d[f"{fw}-seed{k}"] = _distances(weights[fw], saved_weights(d), points)
            loss_self.append(_loss_difference(loss_base[fw], _losses(d)))
    table = np.array(list(self_d.values()))  # (runs, points)
    exact_d = {fw: _distances(weights[fw], saved_weights(d), points) for fw, d in (exact or {}).items()}
    rounding = np.sqrt(sum(np.square(e) for e in exact_d.values())) if exact_d else np.zeros(len(points))
    floor = np.maximum(table.max(axis=0), rounding)
    e = np.array(list(exact_d.values()))
    accuracy = _largest_ratio(e.max(axis=0), e.min(axis=0)) if exact_d else 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(floor > 0, np.array(twin_d) / floor, np.inf)
    spread = max(_largest_ratio(table[i], np.delete(table, i, axis=0).max(axis=0)) for i in range(len(table)))
    loss_twins = _loss_difference(loss_base[first], loss_base[second])
    n = min(len(loss_twins), *(len(x) for x in loss_self))
    loss_floor = np.max(np.array([x[:n] for x in loss_self]), axis=0)
    return Envelope(points, twin_d, floor.tolist(), self_d, exact_d, rounding.tolist(), ratio.tolist(), spread,
                    accuracy, loss_twins[:n].tolist(), loss_floor.tolist())


def _largest_ratio(num: np.ndarray, den: np.ndarray) -> float:
    """The largest num / den over the points where den > 0 (1 where there is none)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.max(np.where(den > 0, num / den, 1.0)))


def _distances(base: Mapping[int, Mapping[str, np.ndarray]], other: Mapping[int, Mapping[str, np.ndarray]],
               points: Sequence[int]) -> list[float]:
    missing = [u for u in points if u not in other]
    if missing:
        raise TwinstepError(f"a drift run saved no checkpoint after update {missing[0]}")
    return [relative_distance(base[u], other[u]) for u in points]
