"""Schedule-free AdamW and SGD for ref_jax (facebookresearch `schedulefree`), one parameter at a time.

The twin of ref_torch._schedule_free: the package's reference formulation with the average x in
the state, so that the evaluation point x and the gradient point y = β·x + (1−β)·z (the parameter
during training) convert exactly both ways (`eval_point`, `train_point`). Counts are per parameter;
`weight_sum` and `lr_max` are 0-d states (float64 for float64 parameters, else float32), the
scalar arithmetic in the hyper-parameters' dtype. Equations: conformance/oracle/optimizers.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp

from ref_jax._kernels import coef, float_count, prepare, zeros


class ScheduleFreeState(NamedTuple):
    step: Any
    z: Any
    x: Any
    weight_sum: Any
    lr_max: Any
    v: Any = None  # schedule_free_adamw's second moment (the package's exp_avg_sq)


def _scalar(p: Any) -> Any:
    return jnp.float64 if p.dtype == jnp.float64 else jnp.float32


def _init(p: Any, adamw: bool) -> ScheduleFreeState:
    # z and x start at the parameter of the first update: `init` sees zeros of its shape, so the
    # first update (step == 0) takes them from p (see schedule_free_update)
    s = jnp.zeros([], _scalar(p))
    return ScheduleFreeState(jnp.zeros([], jnp.int32), zeros(p), zeros(p), s, s, zeros(p) if adamw else None)


def adamw_init(p: Any, cfg: Mapping[str, Any]) -> ScheduleFreeState:
    return _init(p, True)


def sgd_init(p: Any, cfg: Mapping[str, Any]) -> ScheduleFreeState:
    return _init(p, False)


def beta(hp: Mapping[str, Any]) -> Any:
    """The interpolation weight of y between x and z: β1 (adamw) or momentum (sgd)."""
    return hp["betas"][0] if "betas" in hp else hp["momentum"]


def point(s: ScheduleFreeState, b: Any) -> Any:
    """y = β·x + (1−β)·z, with the operations of torch's x.mul(β).add_(z, alpha=1 − β)."""
    return s.x * coef(b, s.x) + coef(1 - b, s.z) * s.z


def update(g, s: ScheduleFreeState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    first = s.step == 0
    z, x = jnp.where(first, p, s.z), jnp.where(first, p, s.x)
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
    u = u + coef(hp["weight_decay"], p) * p  # the decay is taken at y, the parameter in training
    z = z + coef(-lr, z) * u
    x = x * coef(1 - c, x) + coef(c, z) * z
    new = ScheduleFreeState(t, z, x, total.astype(s.weight_sum.dtype), lr_max.astype(s.lr_max.dtype), v)
    return point(new, beta(hp)), new
