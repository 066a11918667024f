"""The references of tools/gen_schedule_cases.py: the lr a schedule gives, from torch, optax or by hand.

`torch_values` steps a torch.optim.lr_scheduler object in float64 on torch.optim.SGD (Adam when
OneCycleLR / CyclicLR cycles beta1) after every optimizer.step(), or once every updates_per_epoch
updates (ReduceLROnPlateau: step(metric) with the metric observed after each update), and reads
the lr (and the cycled momentum) of every group; `optax_warmup_cosine` and `optax_values`
evaluate optax schedules on a float64 count; `keras_restarts` is Keras's own test reference for
CosineDecayRestarts (learning_rate_schedule_test.py's np_cosine_decay_restarts) and
`keras_schedule` evaluates keras.optimizers.schedules.CosineDecayRestarts in float64;
`inverse_sqrt` and `wsd`, which exist in no framework, are their formulas written out (the shapes
of fairseq's inverse_sqrt and transformers' get_wsd_schedule). Never twinstep's code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.optim import lr_scheduler as S

Make = Callable[[torch.optim.Optimizer], S.LRScheduler]
BETA1 = ("adam", "adamw", "adamax", "nadam", "radam")


def torch_values(base: list[float], make: Make, steps: int, upe: int = 1, opt: str = "sgd",
                 momentum: bool = False, metrics: list[float] | None = None,
                 at: list[int] | None = None) -> dict[str, Any]:
    """lr (and cycled momentum) of every group for updates 0..steps-1 (or the updates `at`), from
    torch's own scheduler; `metrics[t]` is given to ReduceLROnPlateau.step after update t."""
    params = [torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in base]
    groups = [{"params": [p], "lr": b} for p, b in zip(params, base)]
    beta1 = opt in BETA1
    optimizer = torch.optim.Adam(groups) if beta1 else torch.optim.SGD(groups, momentum=0.0)
    scheduler = make(optimizer)
    lr, mom = [], []
    for t in range(steps):
        lr.append([float(g["lr"]) for g in optimizer.param_groups])
        mom.append([float(g["betas"][0] if beta1 else g["momentum"]) for g in optimizer.param_groups])
        optimizer.step()
        if metrics is not None and t + 1 < steps:
            scheduler.step(metrics[t])
        elif (t + 1) % upe == 0 and t + 1 < steps:
            scheduler.step()
    if at is not None:
        lr, mom = [lr[t] for t in at], [mom[t] for t in at]
    out: dict[str, Any] = {"lr": _shape(lr)}
    if momentum:
        out["momentum"] = _shape(mom)
    return out


def _shape(rows: list[list[float]]) -> Any:
    return [r[0] for r in rows] if len(rows[0]) == 1 else rows


def optax_warmup_cosine(base: list[float], sf: float, w: int, total: int, eta: float, steps: int) -> list:
    import jax
    import jax.numpy as jnp
    import optax

    with jax.enable_x64(True):
        t = jnp.arange(steps, dtype=jnp.float64)  # float64 count: optax's int32 count would round
        cols = [np.asarray(optax.warmup_cosine_decay_schedule(b * sf, b, w, total, eta)(t)) for b in base]
    return _shape(np.stack(cols, axis=1).tolist())


def optax_values(fns: list[Callable[[Any], Any]], steps: int, at: list[int] | None = None) -> Any:
    """optax schedules (one per group) on a float64 count 0..steps-1 (or `at`), under jax x64."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        t = jnp.asarray(list(range(steps)) if at is None else at, dtype=jnp.float64)
        cols = [np.broadcast_to(np.asarray(fn(t), np.float64), t.shape) for fn in fns]
    return _shape(np.stack(cols, axis=1).tolist())


def keras_restarts(step: int, decay_steps: float, t_mul: float = 2.0, m_mul: float = 1.0,
                   alpha: float = 0.0) -> float:
    """Keras's own reference (keras/src/optimizers/schedules/learning_rate_schedule_test.py,
    CosineDecayRestartsTest.np_cosine_decay_restarts), verbatim but for the names."""
    fac = 1.0
    while step >= decay_steps:
        step -= decay_steps
        decay_steps *= t_mul
        fac *= m_mul
    completed_fraction = step / decay_steps
    decay = fac * 0.5 * (1.0 + math.cos(math.pi * completed_fraction))
    return (1.0 - alpha) * decay + alpha


def keras_schedule(initial: float, first: int, t_mul: float, m_mul: float, alpha: float, steps: list[int]) -> list:
    """keras.optimizers.schedules.CosineDecayRestarts with a float64 initial lr at `steps` (Keras on
    its JAX backend under jax.enable_x64). Keras 3.15 still takes its cosine in float32 there
    (ops.cos promotes float64 with a Python float to float32): ~1e-8 from its test reference."""
    import os

    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"keras_schedule needs KERAS_BACKEND=jax; keras runs on {keras.backend.backend()}")
    with jax.enable_x64(True):
        fn = keras.optimizers.schedules.CosineDecayRestarts(np.float64(initial), first, t_mul=t_mul, m_mul=m_mul,
                                                           alpha=alpha)
        return [float(np.asarray(fn(np.float64(s)), np.float64)) for s in steps]


def warmup(b: float, sf: float, w: int, s: int) -> float:
    return b * (sf + (1.0 - sf) * s / w)


def inverse_sqrt(b: float, sf: float, w: int, tau: int, s: int) -> float:
    """fairseq / transformers inverse square root after a linear warm-up: b·sqrt(τ / (s − W + τ))."""
    return warmup(b, sf, w, s) if s < w else b * math.sqrt(tau / (s - w + tau))


def wsd(b: float, sf: float, w: int, total: int, d: int, kind: str, eta: float, s: int) -> float:
    """transformers' get_wsd_schedule shape with an absolute floor eta: warm-up, b, then decay."""
    if s < w:
        return warmup(b, sf, w, s)
    if s < total - d:
        return b
    p = min((s - (total - d)) / d, 1.0)
    shape = {"linear": 1.0 - p, "cosine": 0.5 * (1.0 + math.cos(math.pi * p)), "1-sqrt": 1.0 - math.sqrt(p)}[kind]
    return eta + (b - eta) * shape


def formula_values(base: list[float], fn: Callable[[float, int], float], steps: int, upe: int = 1) -> Any:
    return _shape([[fn(b, t // upe) for b in base] for t in range(steps)])
