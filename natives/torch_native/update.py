"""The update path on torch's built-ins: torch.optim + lr_scheduler + torch.nn.utils clipping, the
loop of seed 000 and torch's docs: set `.grad`, clip, `optimizer.step()`, `scheduler.step()`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from conformance.config import Config
from conformance.rules.groups import resolve_groups
from conformance.rules.schedules import check_schedule
from natives._protocol import check_update_config, one_micro_batch, refuse
from natives.torch_native.backend import dtype_of, to_numpy
from natives.torch_native.clipping import clip
from natives.torch_native.optimizers import build
from natives.torch_native.schedules import scheduler


def run_updates(config: Config, params: Mapping[str, np.ndarray], windows: Sequence[Sequence[Mapping[str, Any]]],
                position: int = 0, updates_per_epoch: int = 1) -> dict[str, list[Any]]:
    """One plain gradient per update through torch's built-ins; parameters and lrs per update."""
    check_update_config(config, position)
    grads = one_micro_batch(windows)
    check_schedule(config.schedule, config.optimizer, max(len(grads), 1), updates_per_epoch)
    dt = dtype_of(config.precision.param_dtype)
    named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64), dtype=dt)) for k, v in params.items()}
    groups = resolve_groups(config.optimizer, {k: np.shape(v) for k, v in params.items()})
    opts = build(config.optimizer, named, groups)
    if len(opts) != 1:
        raise refuse("optimizer.name = 'muon' with a fallback", "two torch optimizers; an lr_scheduler drives one")
    sched = scheduler(config.schedule, opts[0])
    if config.schedule.name == "reduce_on_plateau":
        raise refuse("schedule.name = 'reduce_on_plateau'", "the update path observes no metric")
    out: dict[str, list[Any]] = {"params": [], "lrs": [], "skipped": [], "scales": []}
    for t, g in enumerate(grads):
        lrs = [float(pg["lr"]) for pg in opts[0].param_groups]
        for name, p in named.items():
            p.grad = torch.tensor(g[name], dtype=dt)
        clip(config.clip, list(named.values()))
        opts[0].step()
        if sched is not None and (t + 1) % updates_per_epoch == 0 and t + 1 < len(grads):
            sched.step()
        out["params"].append({k: to_numpy(p) for k, p in named.items()})
        out["lrs"].append({n: lrs[i] for i, grp in enumerate(groups) for n in grp.names})
        out["skipped"].append(False)
        out["scales"].append(None)
    return out
