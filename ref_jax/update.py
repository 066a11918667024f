"""The whole update path as a neutral entry point, NumPy in and out, over exact gradients.

`run_updates(config, params, windows)` builds the config's optimizer (parameter groups included),
schedule, clipping, accumulation and loss scaling exactly as the trainer does and runs the
trainer's update path (ref_*._update) over one window of micro-batches per update. Each
micro-batch {"g": {name: array}, "count": float, "poison": float} has the loss
L = poison · Σ_k Σ g_k · θ_k, so its gradient is g_k whatever the parameters (poison = inf makes a
non-finite update), its summed loss count · L and its element count `count` (the divisor of
accumulation.normalize = "tokens"). `twinstep port` compares a backend, a generated snippet and the
native objects update by update over such streams (conformance.port.verify.traces).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from conformance.config import Config
from conformance.rules.groups import group_base_lrs, resolve_groups
from conformance.rules.schedules import cycled_hyperparameter, hyper_bases, hyper_field
from conformance.rules.windows import check_window
from ref_jax._schedules import build_hyper, build_scheduler
from ref_jax._update import UpdateSpecs, UpdateState, finish_update, make_update_step
from ref_jax._window import stack_window
from ref_jax.backend import framework_dtype
from ref_jax.losses import LossOutput
from ref_jax.optimizers import build_optimizer
from ref_jax.precision import init_scale_state, init_skip_state, numerics_context

__all__ = ["run_updates"]


def run_updates(config: Config, params: Mapping[str, np.ndarray], windows: Sequence[Sequence[Mapping[str, Any]]],
                position: int = 0, updates_per_epoch: int = 1) -> dict[str, list[Any]]:
    """Run the update path of `config` over `windows` (one list of micro-batches per update, see the
    module docstring) from `params` ({name: array}, in config.precision.param_dtype), the schedule
    starting at `position` (a resumed run) with `updates_per_epoch` updates per epoch (unit =
    "epoch"). Returns {"params": [{name: float64 array} after each update], "lrs": [{name: lr}
    that each update applied to the parameter], "skipped": [bool per update], "scales": [the loss
    scale in force at each update, None without dynamic scaling]}. Raises as the trainer does
    (ConfigError, InputError, NonFiniteError under the non-finite policy)."""
    with numerics_context(config.precision):
        return _run(config, params, windows, position, updates_per_epoch)


def _run(config: Config, params: Mapping[str, np.ndarray], windows: Sequence[Sequence[Mapping[str, Any]]],
         position: int, updates_per_epoch: int) -> dict[str, list[Any]]:
    dt = framework_dtype(config.precision.param_dtype)
    p = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in params.items()}
    groups = resolve_groups(config.optimizer, {k: np.shape(v) for k, v in params.items()})
    tx = build_optimizer(config.optimizer, p)
    built = build_scheduler(config.schedule, group_base_lrs(config.optimizer), updates_per_epoch)
    cycled = cycled_hyperparameter(config.schedule, config.optimizer)
    scheduled = build_hyper(config.schedule, hyper_bases(config.schedule, config.optimizer), updates_per_epoch)
    prec = config.precision
    specs = UpdateSpecs(config.accumulation, config.clip, prec)

    def loss_fn(q: Any, mb: Any) -> LossOutput:
        value = sum(jnp.sum(mb["g"][k] * q[k]) for k in q) * mb["poison"]
        return LossOutput(value, value * mb["count"], mb["count"])

    step = jax.jit(make_update_step(specs, tx, loss_fn))
    state = UpdateState(p, tx.init(p), init_scale_state(prec), init_skip_state())
    out: dict[str, list[Any]] = {"params": [], "lrs": [], "skipped": [], "scales": []}
    for t, window in enumerate(windows):
        at = position + prec.schedule_position(t, int(state.skips.skipped))
        lrs = [float(fn(at)) for fn in built.lr]
        hyper: list[dict[str, Any]] = [{"lr": jnp.asarray(lr, dt)} for lr in lrs]
        for g, fn in enumerate(built.momentum or ()):
            m = jnp.asarray(float(fn(at)), dt)
            hyper[g]["momentum" if cycled == "momentum" else "betas"] = m if cycled == "momentum" else (
                m, state.opt_state.hyperparams[g]["betas"][1])
        for key, fns in scheduled.items():
            for g, fn in enumerate(fns):
                if fn is not None:
                    field, value = hyper_field(key, {**state.opt_state.hyperparams[g], **hyper[g]},
                                               jnp.asarray(float(fn(at)), dt))
                    hyper[g][field] = value
        counts = [mb["count"] for mb in window]
        check_window(config.accumulation, len(window), counts)  # the torch loop checks it too
        batches = [{"g": {k: np.asarray(v, dt) for k, v in mb["g"].items()}, "count": np.asarray(mb["count"], dt),
                    "poison": np.asarray(mb["poison"], dt)} for mb in window]
        state, info = step(state, stack_window(batches, counts, config.accumulation.steps, dt), None, hyper)
        metrics = finish_update(specs, state, info, update=t)
        out["params"].append({k: np.asarray(v, np.float64) for k, v in state.params.items()})
        out["lrs"].append({name: lrs[i] for i, g in enumerate(groups) for name in g.names})
        out["skipped"].append(bool(metrics.skipped))
        out["scales"].append(metrics.loss_scale)
    return out
