"""AdEMAMix (Pagliardini et al. 2024, "The AdEMAMix Optimizer: Better, Faster, Older"), as the
paper's reference code (apple/ml-ademamix, its torch class) computes it: Adam's fast EMA m and a
slow EMA m_slow of the gradients, mixed as (m/(1−β1ᵗ) + α·m_slow) / (√v/√(1−β2ᵗ) + ε), with weight
decay added to that update before the step, p ← p − lr·(u + wd·p). α and β3 may warm up over the
parameter's update count t (1 at its first update): α linearly from 0 (`alpha_warmup` updates),
β3 from β1 linearly in the EMA's half-life (`beta3_warmup` updates); 0 is the reference's None
(no warm-up). Equations: conformance/oracle/optimizers.py.
"""

# JAX: one leaf at a time (ref_jax._elementwise's init/update pair), t a traced count; the warm-up
# lengths are static (a warm-up of 0 compiles no ramp). optax.contrib.ademamix evaluates its b3 and
# alpha schedules at the count before the update (0 first), one behind the reference's t.

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp

from ref_jax._kernels import coef, float_count, prepare, zeros


class AdEMAMixState(NamedTuple):
    step: Any
    m: Any
    m_slow: Any
    v: Any


def alpha_at(group: Mapping[str, Any], t: Any) -> Any:
    """α at update t: α·t/alpha_warmup during the warm-up (the reference's linear_warmup_scheduler
    from 0), then α."""
    warmup = group["alpha_warmup"]
    return jnp.where(t < warmup, t / warmup * group["alpha"], group["alpha"]) if warmup else group["alpha"]


def beta3_at(group: Mapping[str, Any], t: Any) -> Any:
    """β3 at update t: during the warm-up the β whose half-life is the linear blend of β1's and β3's,
    f(β) = ln ½ / ln(β + 10⁻⁸) − 1, β = ½^(1/(f + 1)) (the reference's linear_hl_warmup_scheduler);
    then β3."""
    warmup, b1, b3 = group["beta3_warmup"], group["betas"][0], group["beta3"]
    if not warmup:
        return b3
    a = t / warmup
    blend = (1 - a) * (jnp.log(0.5) / jnp.log(b1 + 1e-8) - 1) + a * (jnp.log(0.5) / jnp.log(b3 + 1e-8) - 1)
    return jnp.where(t < warmup, 0.5 ** (1 / (blend + 1)), b3)


def init(p: Any, cfg: Mapping[str, Any]) -> AdEMAMixState:
    return AdEMAMixState(jnp.zeros([], jnp.int32), zeros(p), zeros(p), zeros(p))


def update(g, s: AdEMAMixState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    b1, b2 = hp["betas"]
    t = s.step + 1
    tf = float_count(t, hp)
    warmups = {**hp, "alpha_warmup": cfg["alpha_warmup"], "beta3_warmup": cfg["beta3_warmup"]}
    b3 = beta3_at(warmups, tf)
    m = s.m * coef(b1, g) + coef(1 - b1, g) * g
    slow = s.m_slow * coef(b3, g) + coef(1 - b3, g) * g
    v = s.v * coef(b2, g) + (coef(1 - b2, g) * g) * g
    denom = jnp.sqrt(v) / coef(jnp.sqrt(1 - b2 ** tf), v) + coef(hp["eps"], v)
    u = (m / coef(1 - b1 ** tf, m) + slow * coef(alpha_at(warmups, tf), slow)) / denom
    if cfg.get("decay_on", True):  # built with weight_decay = 0: no work (rebuilt when switched on)
        u = u + coef(hp["weight_decay"], p) * p
    return p + coef(-hp["lr"], p) * u, AdEMAMixState(t, m, slow, v)


OPTIMIZERS = {"ademamix": (init, update)}
