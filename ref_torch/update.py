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

import numpy as np
import torch

from conformance.config import Config
from conformance.rules.groups import resolve_groups
from ref_torch._schedules import build_hyper, build_scheduler
from ref_torch._update import UpdateSpecs, apply_update
from ref_torch.losses import LossOutput
from ref_torch.optimizers import build_optimizer
from ref_torch.precision import LossScaler, init_skip_state, numerics_context

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
    dt = getattr(torch, config.precision.param_dtype)
    named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64), dtype=dt)) for k, v in params.items()}
    groups = resolve_groups(config.optimizer, {k: np.shape(v) for k, v in params.items()})
    optimizer = build_optimizer(config.optimizer, named.items())
    scheduler = build_scheduler(config.schedule, optimizer, updates_per_epoch, start=position)
    scheduler = build_hyper(config.schedule, optimizer, scheduler, updates_per_epoch, start=position)
    scaler, skips = LossScaler(config.precision), init_skip_state()
    specs = UpdateSpecs(config.accumulation, config.clip, config.precision)

    def loss_fn(p: Any, mb: Any) -> LossOutput:
        value = sum((mb["g"][k] * p[k]).sum() for k in p) * mb["poison"]
        return LossOutput(value, value * mb["count"], torch.tensor(mb["count"], dtype=dt))

    out: dict[str, list[Any]] = {"params": [], "lrs": [], "skipped": [], "scales": []}
    for t, window in enumerate(windows):
        lrs = [float(g["lr"]) for g in optimizer.param_groups]  # the lr update t applies
        batches = [{"g": {k: torch.tensor(v, dtype=dt) for k, v in mb["g"].items()}, "count": mb["count"],
                    "poison": torch.tensor(mb["poison"], dtype=dt)} for mb in window]
        with numerics_context(config.precision):
            skips, info = apply_update(specs, named, optimizer, scheduler, scaler, skips, loss_fn, batches,
                                       [mb["count"] for mb in window], update=t)
        out["params"].append({k: p.detach().double().numpy().copy() for k, p in named.items()})
        out["lrs"].append({name: lrs[i] for i, g in enumerate(groups) for name in g.names})
        out["skipped"].append(bool(info.skipped))
        out["scales"].append(info.loss_scale)
    return out
