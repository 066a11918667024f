"""Native references for the porting checks: torch.optim objects stepped as they are, and the optax
objects an optax-flavoured description names, built by optax itself. Same stream and `Trace` as
conformance.port.verify.traces; torch, jax and optax are imported inside the functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from conformance.port.verify.traces import MicroBatch, Trace

# ------------------------------------------------------------------ native torch objects


def run_native_torch(optimizer: Any, scheduler: Any, named: Mapping[str, Any],
                     windows: list[list[MicroBatch]], scaler: Any = None, clip: Mapping[str, Any] | None = None
                     ) -> Trace:
    """Step native torch objects over the stream (one micro-batch per update): set every
    parameter's grad to G, record each parameter's lr, optimizer.step(), scheduler.step() (not
    ReduceLROnPlateau's, which needs a metric). With a GradScaler, the loop of torch's AMP recipe:
    the loss poison·Σ G·θ scaled and backpropagated, scaler.unscale_, the `clip` call
    (clip_grad_norm_ / clip_grad_value_ with those arguments), scaler.step, scaler.update, then the
    scheduler (also after a skipped step)."""
    import torch

    group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
    out = Trace([], [], [], [])
    for window in windows:
        (mb,) = window
        lrs = {name: float(optimizer.param_groups[group_of[id(p)]]["lr"]) for name, p in named.items()
               if id(p) in group_of}
        if scaler is not None:
            out.skipped.append(_scaled_step(optimizer, named, mb, scaler, clip, out))
        else:
            for name, p in named.items():
                p.grad = torch.tensor(mb["g"][name], dtype=p.dtype)
            _clip(named, clip)
            optimizer.step()
            out.skipped.append(False)
        if scheduler is not None and type(scheduler).__name__ != "ReduceLROnPlateau":
            scheduler.step()  # a gradient stream has no metric: a plateau's lr holds, as the spec's does
        out.params.append({k: p.detach().double().numpy().copy() for k, p in named.items()})
        out.lrs.append(lrs)
    return out


def _clip(named: Mapping[str, Any], clip: Mapping[str, Any] | None) -> None:
    import torch

    if not clip:
        return
    params = list(named.values())
    if "clip_value" in clip:
        torch.nn.utils.clip_grad_value_(params, clip["clip_value"])
    if "max_norm" in clip:
        torch.nn.utils.clip_grad_norm_(params, clip["max_norm"], norm_type=clip.get("norm_type", 2.0),
                                       error_if_nonfinite=clip.get("error_if_nonfinite", False))


def _scaled_step(optimizer: Any, named: Mapping[str, Any], mb: MicroBatch, scaler: Any,
                 clip: Mapping[str, Any] | None, out: Trace) -> bool:
    """One update of torch's AMP recipe; whether GradScaler skipped it."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss = sum((torch.tensor(mb["g"][n], dtype=p.dtype) * p).sum() for n, p in named.items()) * float(mb["poison"])
    out.scales.append(float(scaler.get_scale()))
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    found = any(not torch.isfinite(p.grad).all() for p in named.values() if p.grad is not None)
    _clip(named, clip)
    scaler.step(optimizer)
    scaler.update()
    return found


# ------------------------------------------------------------------ native optax


def build_optax(tx: Any, x64: bool = True) -> Any:
    """The optax object an optax-flavoured description names, built with optax itself (schedules
    evaluated at a float64 count when `x64`: the spec's mathematics, not optax's float32 counts)."""
    import jax.numpy as jnp
    import optax
    import optax.contrib

    def find(name: str) -> Any:  # optax's transforms, and optax.contrib's schedule-free ones
        return getattr(optax, name, None) or getattr(optax.contrib, name, None)

    def value(v: Any) -> Any:
        if isinstance(v, list):
            return [value(x) for x in v]
        if isinstance(v, Mapping) and len(v) == 1:
            (name, args), = v.items()
            if name == "chain":
                return optax.chain(*[value(x) for x in args])
            if name == "inject_hyperparams":  # {inject_hyperparams = {adamw = {...}, static_args = ...}}
                extra = {k: args[k] for k in ("static_args", "hyperparam_dtype") if k in args}
                (inner, kwargs), = ((k, a) for k, a in args.items() if k not in extra)
                return optax.inject_hyperparams(find(inner), **extra)(**{k: value(a) for k, a in kwargs.items()})
            if find(name) is not None and isinstance(args, Mapping):
                kwargs = {k: value(a) for k, a in args.items()}
                if name == "piecewise_constant_schedule" and kwargs.get("boundaries_and_scales"):
                    kwargs["boundaries_and_scales"] = {int(k): s for k, s in args["boundaries_and_scales"].items()}
                if name.endswith(("schedule", "schedules")) or name == "exponential_decay":
                    sched = find(name)(**kwargs)
                    return (lambda c, s=sched: s(jnp.asarray(c, jnp.float64))) if x64 else sched
                if name == "MultiSteps":
                    kwargs["accumulator_dtype"] = jnp.float64 if x64 else jnp.float32
                return find(name)(**kwargs)
        return v

    if isinstance(tx, Mapping) and set(tx) <= {"chain", "MultiSteps"} | set(dir(optax)) | set(dir(optax.contrib)):
        return value(tx if len(tx) == 1 else [{k: v} for k, v in tx.items()])
    return value(tx)


def run_native_optax(optax_table: Mapping[str, Any], params: Mapping[str, np.ndarray],
                     windows: list[list[MicroBatch]]) -> Trace:
    """Run the optax transform an [optax] table describes (no twinstep code) over the stream: every
    micro-batch's gradient goes through tx.update (MultiSteps accumulates them), float64."""
    import jax
    import jax.numpy as jnp
    import optax

    table = {k: v for k, v in optax_table.items() if k != "no_weight_decay"}
    tx = build_optax(table)
    p = {k: jnp.asarray(v, jnp.float64) for k, v in params.items()}
    state = tx.init(p)

    @jax.jit
    def step(g: Any, state: Any, p: Any) -> tuple[Any, Any]:
        updates, state = tx.update(g, state, p)
        return optax.apply_updates(p, updates), state

    out = Trace([], [], [], [])
    for window in windows:
        for mb in window:
            p, state = step({k: jnp.asarray(v, jnp.float64) for k, v in mb["g"].items()}, state, p)
        out.params.append({k: np.asarray(v, np.float64) for k, v in p.items()})
        out.lrs.append({})
        out.skipped.append(False)
    return out
