"""The whole update path in NumPy float64, from the equations: the oracle's `run_updates`.

Each micro-batch {"g": {name: array}, "count": c, "poison": π} has the loss L = π·Σ_k Σ g_k·θ_k
(ref_*.update's convention), so its gradient is π·g_k. Update t over a window of n micro-batches:

    window gradient   G = Σ_j π_j·g_j / n                         (normalize = "micro_batches")
                      G = Σ_j c_j·π_j·g_j / Σ_j c_j               (normalize = "tokens")
    loss scaling      G ← (G·S)·float32(1/S) with S the scale in force (dynamic scaling only)
    finite check      the update is skipped when a window loss or G is non-finite: parameters and
                      optimizer state stay, the non-finite policy may raise (rules.nonfinite)
    clip              G ← clip(G) by [clip] (oracle.clipping), the norm taken before clipping;
                      with clip.target = "updates" G is not clipped and the step is, after it:
                      p ← p + clip(p' − p) with p' the optimizer's result
    step              each parameter by its group's optimizer (oracle.optimizers.update; prodigy all
                      at once, oracle.prodigy.update_all) with
                      lr = the group's schedule at s (oracle.schedules), onecycle's cycled momentum
                      or beta1 and every [schedule.hyper.<key>] from the group's own value likewise
    schedule          s = position + t − (skips so far, with schedule_on_skip = "hold"), divided by
                      updates_per_epoch with unit = "epoch" (docs/contract.md §2)
    loss scale        GradScaler's update rule (oracle.precision.update_scale)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.config import Config
from conformance.oracle import prodigy
from conformance.oracle.clipping import clip_and_norm
from conformance.oracle.optimizers import init_state, update
from conformance.oracle.precision import inverse_scale, update_scale
from conformance.oracle.schedules import lr_function, momentum_function
from conformance.rules.groups import group_base_lrs, group_of, resolve_groups
from conformance.rules.nonfinite import check_nonfinite
from conformance.rules.schedules import check_schedule, cycled_hyperparameter, hyper_bases, hyper_field, start_lrs
from conformance.rules.windows import check_window

__all__ = ["run_updates"]


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(x, np.float64).astype(dtype).astype(np.float64)


def _window_gradient(config: Config, window: Sequence[Mapping[str, Any]], params: Mapping[str, np.ndarray]
                     ) -> tuple[dict[str, np.ndarray], bool]:
    """The window's normalized gradient and whether every micro-batch loss is finite."""
    counts = [float(mb["count"]) for mb in window]
    tokens = config.accumulation.normalize == "tokens"
    total = float(np.sum(np.asarray(counts, np.float64))) if tokens else float(len(window))
    grads = {k: np.zeros(np.shape(v)) for k, v in params.items()}
    loss_ok = True
    with np.errstate(invalid="ignore", over="ignore"):  # a poisoned window is a valid input
        for mb, c in zip(window, counts):
            poison = float(mb["poison"])
            loss = poison * sum(float(np.sum(np.asarray(mb["g"][k], np.float64) * params[k])) for k in params)
            loss_ok = loss_ok and math.isfinite(loss)
            weight = c if tokens else 1.0
            for k in params:
                grads[k] = grads[k] + weight * poison * np.asarray(mb["g"][k], np.float64) / total
    return grads, loss_ok


def run_updates(config: Config, params: Mapping[str, np.ndarray], windows: Sequence[Sequence[Mapping[str, Any]]],
                position: int = 0, updates_per_epoch: int = 1) -> dict[str, list[Any]]:
    """Run the update path of `config` over `windows` (one list of micro-batches per update, see the
    module docstring) from `params` ({name: array}, in config.precision.param_dtype), the schedule
    starting at `position` (a resumed run) with `updates_per_epoch` updates per epoch (unit =
    "epoch"). Returns {"params": [{name: float64 array} after each update], "lrs": [{name: lr}
    that each update applied to the parameter], "skipped": [bool per update], "scales": [the loss
    scale in force at each update, None without dynamic scaling]}. Raises as the trainer does
    (ConfigError, InputError, NonFiniteError under the non-finite policy)."""
    prec, opt, sched = config.precision, config.optimizer, config.schedule
    dt = prec.param_dtype
    per_epoch = updates_per_epoch
    if windows:
        check_schedule(sched, opt, position + len(windows), per_epoch)  # unit = "update" needs 1
    p = {k: _round(v, dt) for k, v in params.items()}
    groups = resolve_groups(opt, {k: np.shape(v) for k, v in p.items()})
    owner = group_of(groups)
    lr_fns = [lr_function(sched, b) for b in start_lrs(sched, group_base_lrs(opt))]
    cycled = cycled_hyperparameter(sched, opt)
    momentum_fn = momentum_function(sched) if cycled else None
    hyper_fns = {key: [None if b is None else lr_function(sched.hyper[key], b) for b in bases]  # type: ignore[index]
                 for key, bases in hyper_bases(sched, opt).items()}
    states: dict[str, dict[str, np.ndarray]] = {}
    scale, tracker, skipped, consecutive = np.float32(prec.init_scale), 0, 0, 0
    out: dict[str, list[Any]] = {"params": [], "lrs": [], "skipped": [], "scales": []}
    for t, window in enumerate(windows):
        check_window(config.accumulation, len(window), [mb["count"] for mb in window])
        s = np.asarray((position + prec.schedule_position(t, skipped)) // per_epoch, np.int64)
        lrs = [float(fn(s)) for fn in lr_fns]
        grads, loss_ok = _window_gradient(config, window, p)
        if prec.dynamic_scaling:
            with np.errstate(invalid="ignore", over="ignore"):
                grads = {k: (g * np.float64(scale)) * np.float64(inverse_scale(scale)) for k, g in grads.items()}
        grads_ok = {k: bool(np.all(np.isfinite(g))) for k, g in grads.items()}
        finite = loss_ok and all(grads_ok.values())
        consecutive = 0 if finite else consecutive + 1
        out["scales"].append(float(scale) if prec.dynamic_scaling else None)
        if finite:
            on_grads, on_step = config.clip.targets()
            clipped = clip_and_norm(on_grads, grads)["grads"]
            before = dict(p)
            if opt.name == "prodigy":  # one d for every parameter: all at once (lr the only scheduled field)
                hps = [dict(group.hyperparams, lr=lrs[i]) for i, group in enumerate(groups)]
                moved, states = prodigy.update_all(hps, owner, p, {k: g for k, g in clipped.items() if p[k].size},
                                                   states)
                p = {k: _round(v, dt) for k, v in moved.items()}
            for name, g in clipped.items() if opt.name != "prodigy" else ():
                if p[name].size == 0:
                    continue  # zero-size parameters are left out of the optimizer
                group = groups[owner[name]]
                hp = dict(group.hyperparams, lr=lrs[owner[name]])
                if momentum_fn is not None:
                    m = float(momentum_fn(s))
                    hp.update(momentum=m) if cycled == "momentum" else hp.update(betas=(m, hp["betas"][1]))
                for key, fns in hyper_fns.items():
                    fn = fns[owner[name]]
                    if fn is not None:
                        field, value = hyper_field(key, hp, float(fn(s)))
                        hp[field] = value
                st = states.get(name) or init_state(group.optimizer, hp, p[name])
                new, states[name] = update(group.optimizer, hp, p[name], g, st, dt)
                p[name] = _round(new, dt)
            if on_step is not None:  # clip the step taken, Δ = p' − p, and apply p + clip(Δ)
                steps = clip_and_norm(on_step, {k: p[k] - before[k] for k in p})["grads"]
                p = {k: _round(before[k] + steps[k], dt) for k in p}
        else:
            skipped += 1
            check_nonfinite(prec, consecutive, loss_ok, grads_ok, update=t)
        if prec.dynamic_scaling:
            scale, tracker = update_scale(prec, scale, tracker, finite)
        out["params"].append({k: v.copy() for k, v in p.items()})
        out["lrs"].append({name: lrs[i] for i, g in enumerate(groups) for name in g.names})
        out["skipped"].append(not finite)
    return out
