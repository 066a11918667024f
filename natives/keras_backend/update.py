"""The update path in Keras: the optimizer with the schedule as its learning rate and its own
clipping arguments (global_clipnorm, clipnorm per variable, clipvalue), one apply per update."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.config import ClipSpec, Config
from conformance.config.clip import TORCH_EPS
from conformance.rules.schedules import check_schedule
from natives._protocol import check_update_config, one_micro_batch, require
from natives.keras_backend.backend import dtype_of, to_numpy
from natives.keras_backend.optimizers import apply, build, prepare, variables
from natives.keras_backend.schedules import schedule, values


def clip_args(spec: ClipSpec) -> dict[str, Any]:
    """Keras's clipping arguments: global_clipnorm (2-norm, no eps), clipnorm (per variable), clipvalue."""
    require(spec, "clip", "target", ("gradients",), "Keras's optimizers (they clip the gradients)")
    if spec.mode == "value":
        return {"clipvalue": spec.clip_value}
    if spec.mode == "none":
        return {}
    require(spec, "clip", "clip_value", (None,), "Keras's optimizers (one of clipvalue, clipnorm, global_clipnorm)")
    require(spec, "clip", "norm_type", (2.0,), "Keras's clipnorm (the 2-norm only)")
    require(spec, "clip", "error_if_nonfinite", (False,), "Keras's clipnorm")
    require(spec, "clip", "eps", (TORCH_EPS, 0.0), "Keras's clipnorm (no eps)")
    return {"clipnorm" if spec.per_parameter else "global_clipnorm": spec.max_norm}


def run_updates(config: Config, params: Mapping[str, np.ndarray], windows: Sequence[Sequence[Mapping[str, Any]]],
                position: int = 0, updates_per_epoch: int = 1) -> dict[str, list[Any]]:
    """One plain gradient per update through a Keras optimizer; parameters and lrs per update."""
    check_update_config(config, position)
    grads = one_micro_batch(windows)
    check_schedule(config.schedule, config.optimizer, max(len(grads), 1), updates_per_epoch)
    dt = dtype_of(config.precision.param_dtype)
    lr = schedule(config.schedule, config.optimizer.lr)
    opt = build(config.optimizer, lr, clip_args(config.clip))
    named = variables(params, dt)
    prepare(opt, config.optimizer, named)
    rates = values(lr, range(len(grads)))
    out: dict[str, list[Any]] = {"params": [], "lrs": [], "skipped": [], "scales": []}
    for rate, g in zip(rates, grads):
        apply(opt, named, g, dt)
        out["params"].append({k: to_numpy(v.value) for k, v in named.items()})
        out["lrs"].append(dict.fromkeys(named, rate))
        out["skipped"].append(False)
        out["scales"].append(None)
    return out
