"""Schedule-free AdamW and SGD (facebookresearch `schedulefree`), with twinstep's per-parameter counts.

The package's AdamWScheduleFree / SGDScheduleFree update (y and z only: the parameter is the
gradient point y, the average x is implicit), written over twinstep's per-parameter counts: the
package counts updates per parameter group, twinstep per parameter as torch.optim does (equal
when every parameter has a gradient). The evaluation point is x = (y − (1−β)·z)/β (torch's
lerp(y, z, 1 − 1/β), the package's eval()), the gradient point y = lerp(x, z, 1 − β) (its
train()); the round trip rounds, so the trainers hold x between updates and move to y and back at
each update, which keeps a resumed run bit for bit. `weight_sum` and `lr_max` are 0-d states
(float64 for float64 parameters, else float32). Equations: conformance/oracle/optimizers.py.
"""

# Per-parameter pure functions: `init` / `update` pairs that ref_jax._elementwise dispatches to;
# `eval_point` and `train_point` return one parameter's x or y as a new array. The scalar
# arithmetic is in the hyper-parameters' dtype.

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


def beta(group: Mapping[str, Any]) -> Any:
    """The interpolation weight of y between x and z for one parameter group: β1 (adamw) or
    momentum (sgd)."""
    return group["betas"][0] if "betas" in group else group["momentum"]


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


# each schedule-free optimizer's implementation by its name in conformance.config.optimizer
OPTIMIZERS = {"schedule_free_adamw": (adamw_init, update), "schedule_free_sgd": (sgd_init, update)}
