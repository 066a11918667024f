"""What every native backend shares, framework-free: the refusals of mapping rule 2 (natives/__init__.py)
and the case protocol's plumbing (which gradient update t gets, which micro-batches form a window)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.errors import UnsupportedError


def refuse(what: str, why: str) -> UnsupportedError:
    """The one-line reason a native backend cannot run a case: `what` the spec asks, `why` not."""
    return UnsupportedError(f"{what}: {why}")


def require(spec: Any, section: str, field: str, allowed: Sequence[Any], native: str) -> None:
    """Mapping rule 2: `spec.field` must be one of `allowed` (the default, or the values `native`
    can express); anything else is unsupported, naming the field and the native construct."""
    value = getattr(spec, field)
    if value not in allowed:
        raise refuse(f"{section}.{field} = {value!r}", f"{native} has no equivalent")


def ema_due(ema: Any, t: int) -> bool:
    """Whether a user's loop updates the weights' average after update t ([ema]: every `every`
    updates from update `start` on, conformance/config/ema.py)."""
    return t >= ema.start and (t - ema.start) % ema.every == 0


def updates(grads: Sequence[Any] | None, steps: int | None) -> int:
    """The number of updates of a run_trajectory call."""
    return len(grads) if grads is not None else int(steps or 0)


def gradients(t: int, names: Sequence[str], current: Mapping[str, np.ndarray], grads: Sequence[Any] | None,
              objective: Mapping[str, Any] | None) -> dict[str, np.ndarray | None]:
    """The gradient of update t per parameter (None: no gradient), from the case's `grads` tables or
    from its quadratic objective at the current parameters (docs/backends.md, run_trajectory)."""
    if grads is not None:
        return {n: (None if grads[t].get(n) is None else np.asarray(grads[t][n], np.float64)) for n in names}
    assert objective is not None
    return {n: np.asarray(objective["curvature"][n], np.float64) * (current[n] - objective["center"][n])
            for n in names}


def window_slices(count: int, steps: int, drop_last: bool) -> list[range]:
    """The micro-batch indices of each window: full windows of `steps`, then the rest unless dropped."""
    out = [range(i, min(i + steps, count)) for i in range(0, count, steps)]
    return [w for w in out if len(w) == steps or not drop_last]


def one_micro_batch(windows: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, np.ndarray]]:
    """The gradient of every update of a run_updates call whose windows hold one plain micro-batch
    (count 1, poison 1: the harness's optimizer cases); anything else is unsupported."""
    out = []
    for t, window in enumerate(windows):
        if len(window) != 1 or window[0].get("count", 1.0) != 1.0 or window[0].get("poison", 1.0) != 1.0:
            raise refuse(f"update {t}: a window of {len(window)} micro-batch(es) with counts or poison",
                         "the native update paths run one plain gradient per update")
        out.append({k: np.asarray(v, np.float64) for k, v in window[0]["g"].items()})
    return out


def check_update_config(config: Any, position: int, hyper: bool = False) -> None:
    """The parts of a training config a native run_updates maps: optimizer, schedule, clip; the rest at
    its defaults (one micro-batch per update, no loss scaling, the run's dtype). `hyper`: the native
    maps [schedule.hyper] (optax's inject_hyperparams)."""
    if position:
        raise refuse(f"position = {position}", "a native update path starts at update 0")
    if config.accumulation.steps != 1:
        raise refuse(f"accumulation.steps = {config.accumulation.steps}", "one micro-batch per update only")
    if config.schedule.hyper and not hyper:
        raise refuse(f"schedule.hyper ({', '.join(config.schedule.hyper)})",
                     "torch's lr_scheduler and Keras's schedules drive the lr alone")
    if config.precision.dynamic_scaling:
        raise refuse("precision: dynamic loss scaling", "not mapped on the native update path")
