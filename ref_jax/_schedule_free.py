"""Schedule-free AdamW and SGD for ref_jax (facebookresearch `schedulefree`), one parameter at a time.

The twin of ref_torch._schedule_free: the package's AdamWScheduleFree / SGDScheduleFree update with
the parameter at the gradient point y and the average x implicit, x = (y − (1−β)·z)/β
(`eval_point`, `train_point`: torch's lerp with weights 1 − 1/β and 1 − β). Counts are per
parameter; `weight_sum` and `lr_max` are 0-d states (float64 for float64 parameters, else
float32), the scalar arithmetic in the hyper-parameters' dtype. Equations:
conformance/oracle/optimizers.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp

from ref_jax._kernels import coef, float_count, lerp, prepare, zeros


class ScheduleFreeState(NamedTuple):
    step: Any
    z: Any
    weight_sum: Any
    lr_max: Any
    v: Any = None  # schedule_free_adamw's second moment (the package's exp_avg_sq)


def _init(p: Any, adamw: bool) -> ScheduleFreeState:
    # z starts at the parameter (init(params) sees the parameters; torch copies them at the first update)
    s = jnp.zeros([], jnp.float64 if p.dtype == jnp.float64 else jnp.float32)
    return ScheduleFreeState(jnp.zeros([], jnp.int32), jnp.array(p, copy=True), s, s, zeros(p) if adamw else None)


def adamw_init(p: Any, cfg: Mapping[str, Any]) -> ScheduleFreeState:
    return _init(p, True)


def sgd_init(p: Any, cfg: Mapping[str, Any]) -> ScheduleFreeState:
    return _init(p, False)


def beta(hp: Mapping[str, Any]) -> Any:
    """The interpolation weight of y between x and z: β1 (adamw) or momentum (sgd)."""
    return hp["betas"][0] if "betas" in hp else hp["momentum"]


def eval_point(y: Any, s: ScheduleFreeState, b: Any) -> Any:
    """x = lerp(y, z, 1 − 1/β) (schedulefree's optimizer.eval())."""
    return lerp(y, s.z.astype(y.dtype), 1 - 1 / b)


def train_point(x: Any, s: ScheduleFreeState, b: Any) -> Any:
    """y = lerp(x, z, 1 − β) (schedulefree's optimizer.train())."""
    return lerp(x, s.z.astype(x.dtype), 1 - b)


def update(g, s: ScheduleFreeState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    z = s.z.astype(p.dtype)
    t = s.step + 1
    tf = float_count(t, hp)
    warmup = cfg["warmup_steps"]
    lr = hp["lr"] * (jnp.where(tf - 1 < warmup, tf / warmup, 1.0) if warmup else 1.0)
    lr_max = jnp.maximum(s.lr_max.astype(tf.dtype), lr)
    weight = tf ** cfg["r"] * lr_max ** cfg["weight_lr_power"]
    total = s.weight_sum.astype(tf.dtype) + weight
    c = jnp.where(total != 0, weight / jnp.where(total != 0, total, 1.0), 0.0)
    v = s.v
    if v is not None:
        b2 = hp["betas"][1]
        v = v * coef(b2, g) + (coef(1 - b2, g) * g) * g
        u = g / (jnp.sqrt(v / coef(1 - b2 ** tf, v)) + coef(hp["eps"], v))
    else:
        u = g
    if cfg.get("decay_on", True):
        u = u + coef(hp["weight_decay"], p) * p  # the decay is taken at y, the parameter in training
    y = lerp(p, z, c) + coef(lr * (beta(hp) * (1 - c) - 1), p) * u
    z = z - coef(lr, z) * u
    return y, ScheduleFreeState(t, z, total.astype(s.weight_sum.dtype), lr_max.astype(s.lr_max.dtype), v)
