"""The update path in optax: chain(clipping, optimizer) (clip.target = "updates": chain(optimizer,
clipping)) with each group's schedule as its learning rate, applied once per update (optax's count
drives the schedule: update t applies schedule(t));
[schedule.hyper] through optax.inject_hyperparams around the alias (its count drives them alike)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from conformance.config import Config
from conformance.rules.groups import resolve_groups
from conformance.rules.schedules import check_schedule, hyper_bases
from natives._protocol import check_update_config, one_micro_batch
from natives.optax_native.backend import dtype_of, to_numpy
from natives.optax_native.clipping import transform as clipping
from natives.optax_native.optimizers import build
from natives.optax_native.schedules import schedule_fn


def run_updates(config: Config, params: Mapping[str, np.ndarray], windows: Sequence[Sequence[Mapping[str, Any]]],
                position: int = 0, updates_per_epoch: int = 1) -> dict[str, list[Any]]:
    """One plain gradient per update through optax; parameters and lrs per update."""
    check_update_config(config, position, hyper=True)
    grads = one_micro_batch(windows)
    check_schedule(config.schedule, config.optimizer, max(len(grads), 1), updates_per_epoch)
    dt = dtype_of(config.precision.param_dtype)
    groups = resolve_groups(config.optimizer, {k: np.shape(v) for k, v in params.items()})
    fns = [schedule_fn(config.schedule, g.hyperparams["lr"], len(grads), updates_per_epoch) for g in groups]
    # [schedule.hyper]: each key's optax schedule from every reading group's own value (None: not read)
    hyper = {key: [None if b is None else schedule_fn(spec, b, len(grads), updates_per_epoch)
                   for b in hyper_bases(config.schedule, config.optimizer)[key]]
             for key, spec in (config.schedule.hyper or {}).items()}
    core = build(config.optimizer, groups, fns, hyper)
    # clip.target = "updates": the clip after the optimizer sees its updates (optax's own order)
    tx = optax.chain(core, clipping(config.clip)) if config.clip.target == "updates" else \
        optax.chain(clipping(config.clip), core)
    p = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in params.items()}
    state = tx.init(p)
    out: dict[str, list[Any]] = {"params": [], "lrs": [], "skipped": [], "scales": []}
    for t, g in enumerate(grads):
        lrs = [float(f(jnp.asarray(t, jnp.int32))) for f in fns]
        u, state = tx.update({k: jnp.asarray(v, dt) for k, v in g.items()}, state, p)
        p = optax.apply_updates(p, u)
        out["params"].append({k: to_numpy(v) for k, v in p.items()})
        out["lrs"].append({n: lrs[i] for i, grp in enumerate(groups) for n in grp.names})
        out["skipped"].append(False)
        out["scales"].append(None)
    return out
