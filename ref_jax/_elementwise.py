"""Per-parameter optimizer math written out where the framework's optimizer library has none or
computes it differently, in the operation order of torch.optim's kernels and in its vocabulary (the
equations: conformance/oracle/optimizers.py). Each parameter keeps its own update count, and one
without a gradient in an update keeps its state, as torch.optim does.
"""

# JAX: every optimizer's update written with jnp, one leaf (parameter) at a time.
#
# Each optimizer is a pair `init(p, cfg) -> State` and `update(g, s, p, hp, cfg) -> (new_p, State)`
# (or `(Delta(u), State)` where torch's kernel ends with one add, p + u),
# where `hp` holds the dynamic hyper-parameters (arrays, settable every update: lr, betas, ...) and
# `cfg` the static ones. The operation order follows torch's single-tensor kernels (lerp, addcmul,
# addcdiv; scalar coefficients such as bias corrections computed in the hyper-parameter dtype, i.e.
# float64 under x64, as torch computes them in Python floats), so float64 results agree with
# torch.optim to a few ulps. States are NamedTuples whose field names are the neutral names of
# docs/contract.md §4 (conformance.rules.state.state_shapes); fields that are None do not exist for that
# parameter. Half-precision parameters are updated in float32 and rounded once per update.
#
# Why not optax's scale_by_* directly: they keep one count per transform (torch keeps one per
# parameter, and a parameter without a gradient keeps its own), and they compute in the dtype of
# the hyper-parameters they are given; the conformance tests show where each one equals these.

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ref_jax import _ademamix, _schedule_free
from ref_jax._kernels import cast_like, coef, decay, float_count, lerp, prepare, zeros
from ref_jax._matrix import adafactor_init, adafactor_update, muon_init, muon_update


class Delta(NamedTuple):
    """An update u with torch's new parameter equal to p + u (one add), returned instead of the new
    parameter where the torch kernel ends with a single add (no decoupled decay)."""

    u: Any


class SGDState(NamedTuple):
    step: Any
    momentum_buffer: Any  # None for a group built without momentum (cfg["momentum_on"] false)
    initialized: Any  # torch creates the buffer at the first update with momentum != 0


class AdamState(NamedTuple):
    step: Any
    m: Any
    v: Any
    v_max: Any = None
    v_hat_max: Any = None


class RMSpropState(NamedTuple):
    step: Any
    square_avg: Any
    grad_avg: Any
    momentum_buffer: Any  # None for a group built without momentum (cfg["momentum_on"] false)
    initialized: Any  # torch creates the buffer at the first update if momentum > 0 then


class AdagradState(NamedTuple):
    step: Any
    sum: Any


class AdamaxState(NamedTuple):
    step: Any
    m: Any
    u: Any


class NAdamState(NamedTuple):
    step: Any
    m: Any
    v: Any
    mu_product: Any


class LionState(NamedTuple):
    step: Any
    m: Any


INTERNAL_FIELDS = ("initialized",)  # not part of the neutral state


# ------------------------------------------------------------------ sgd


def sgd_init(p: Any, cfg: Mapping[str, Any]) -> SGDState:
    return SGDState(jnp.zeros([], jnp.int32), zeros(p) if cfg["momentum_on"] else None, jnp.zeros([], bool))


def _flag(x: Any, dtype: Any) -> Any:
    return jnp.asarray(x).astype(dtype)


def _finish(p: Any, step: Any, cfg: Mapping[str, Any]) -> Any:
    # torch's kernel ends with p + step: Delta when p itself is untouched, else the decayed p + step
    return p + step if cfg["decoupled"] and cfg.get("decay_on", True) else Delta(step)


def sgd_update(g, s: SGDState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, cfg["decoupled"])
    if not cfg["momentum_on"]:  # built without momentum: torch's plain step, no buffer to carry
        return _finish(p, coef(-hp["lr"], p) * g, cfg), SGDState(s.step + 1, None, s.initialized)
    mu = hp["momentum"]
    # buf ← a·buf + b·g with scalar a, b (one fused pass): steady (μ, 1 − dampening), torch's first
    # buffer g (0, 1), momentum 0 (1, 0: torch keeps no buffer update); x·1 + y·0 is x exactly.
    # Momentum is a value like any other: schedules (OneCycle) may switch it on after update 0.
    on, first = _flag(mu != 0, g.dtype), _flag(~s.initialized, g.dtype)
    a = coef(mu, g) * (1 - first) * on + (1 - on)
    b = (coef(1 - hp["dampening"], g) * (1 - first) + first) * on
    buf = s.momentum_buffer * a + g * b
    d = g + (coef(mu, g) * on) * buf if cfg["nesterov"] else jnp.where(mu != 0, buf, g)  # a select, no flops
    return _finish(p, coef(-hp["lr"], p) * d, cfg), SGDState(s.step + 1, buf, s.initialized | (mu != 0))


# ------------------------------------------------------------------ adam, adamw


def adam_init(p: Any, cfg: Mapping[str, Any]) -> AdamState:
    z = zeros(p)
    variant = cfg["amsgrad_variant"] if cfg["amsgrad"] else None
    return AdamState(jnp.zeros([], jnp.int32), z, z, z if variant in ("torch", "optax_raw") else None,
                     z if variant == "optax" else None)


def adam_update(g, s: AdamState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, cfg["decoupled"])
    b1, b2 = hp["betas"]
    t = s.step + 1
    m = lerp(s.m, g, 1 - b1)
    v = s.v * coef(b2, g) + (coef(1 - b2, g) * g) * g
    bc1, bc2 = 1 - b1 ** float_count(t, hp), 1 - b2 ** float_count(t, hp)
    eps, root = coef(hp["eps"], g), cfg["eps_root"]
    v_max, v_hat_max = s.v_max, s.v_hat_max
    if v_hat_max is not None:  # optax.scale_by_amsgrad: max of the bias-corrected v
        v_hat_max = jnp.maximum(v_hat_max, v / coef(bc2, v))
        denom = jnp.sqrt(v_hat_max + coef(root, v)) + eps
    elif v_max is not None and cfg["amsgrad_variant"] == "optax_raw":
        v_max = jnp.maximum(v_max, v)
        denom = jnp.sqrt(v_max + coef(root, v)) + eps
    else:
        if v_max is not None:
            v_max = jnp.maximum(v_max, v)
        second = v if v_max is None else v_max
        if cfg["eps_hat"]:  # Keras: α = lr·√(1−β2ᵗ)/(1−β1ᵗ), p ← p − α·m/(√v + ε)
            step = (coef(-hp["lr"] * bc2 ** 0.5 / bc1, p) * m) / (jnp.sqrt(second) + eps)
            return _finish(p, step, cfg), AdamState(t, m, v, v_max, v_hat_max)
        if root:
            denom = jnp.sqrt(second / coef(bc2, v) + coef(root, v)) + eps
        else:
            denom = jnp.sqrt(second) / coef(jnp.sqrt(bc2), v) + eps
    step = (coef(-hp["lr"] / bc1, p) * m) / denom
    return _finish(p, step, cfg), AdamState(t, m, v, v_max, v_hat_max)


# ------------------------------------------------------------------ rmsprop


def rmsprop_init(p: Any, cfg: Mapping[str, Any]) -> RMSpropState:
    z = zeros(p)
    buf = z if cfg["momentum_on"] else None
    return RMSpropState(jnp.zeros([], jnp.int32), z, z if cfg["centered"] else None, buf, jnp.zeros([], bool))


def rmsprop_update(g, s: RMSpropState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, cfg["decoupled"])
    a = hp["alpha"]
    sq = s.square_avg * coef(a, g) + (coef(1 - a, g) * g) * g
    grad_avg = s.grad_avg
    if cfg["centered"]:
        grad_avg = lerp(grad_avg, g, 1 - a)
        var = sq + (-grad_avg) * grad_avg
    else:
        var = sq
    eps = coef(hp["eps"], g)
    avg = jnp.sqrt(var + eps) if cfg["eps_in_sqrt"] else jnp.sqrt(var) + eps
    if not cfg["momentum_on"]:  # built without momentum: torch's plain step, no buffer to carry
        step = (coef(-hp["lr"], g) * g) / avg  # torch's addcdiv rounds (-lr·g)/avg
        return _finish(p, step, cfg), RMSpropState(s.step + 1, sq, grad_avg, None, s.initialized)
    mu = hp["momentum"]
    on = mu > 0  # momentum 0: torch's plain step, buffer untouched
    # one division either way: torch's addcdiv rounds (-lr·g)/avg on the plain path, g/avg into the buffer
    q = jnp.where(on, g, coef(-hp["lr"], g) * g) / avg
    buf = jnp.where(on, s.momentum_buffer * coef(mu, g) + q, s.momentum_buffer)
    step = jnp.where(on, coef(-hp["lr"], p) * buf, q)
    made = jnp.where(s.step == 0, mu > 0, s.initialized)
    return _finish(p, step, cfg), RMSpropState(s.step + 1, sq, grad_avg, buf, made)


# ------------------------------------------------------------------ adagrad


def adagrad_init(p: Any, cfg: Mapping[str, Any]) -> AdagradState:
    return AdagradState(jnp.zeros([], jnp.int32), jnp.full(p.shape, cfg["initial_accumulator_value"], p.dtype))


def adagrad_update(g, s: AdagradState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, cfg["decoupled"])
    t = s.step + 1
    clr = hp["lr"] / (1 + (float_count(t, hp) - 1) * hp["lr_decay"])
    acc = s.sum + g * g
    eps = coef(hp["eps"], g)
    if cfg["eps_in_sqrt"]:  # optax.scale_by_rss: g * rsqrt(S + eps), 0 where S = 0
        step = coef(-clr, p) * (g * jnp.where(acc > 0, jax.lax.rsqrt(acc + eps), 0))
    else:
        step = (coef(-clr, p) * g) / (jnp.sqrt(acc) + eps)
    return _finish(p, step, cfg), AdagradState(t, acc)


# ------------------------------------------------------------------ adamax


def adamax_init(p: Any, cfg: Mapping[str, Any]) -> AdamaxState:
    return AdamaxState(jnp.zeros([], jnp.int32), zeros(p), zeros(p))


def adamax_update(g, s: AdamaxState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, cfg["decoupled"])
    b1, b2 = hp["betas"]
    t = s.step + 1
    m = lerp(s.m, g, 1 - b1)
    clr = hp["lr"] / (1 - b1 ** float_count(t, hp))
    if cfg["eps_hat"]:  # Keras: eps outside the max
        u = jnp.maximum(s.u * coef(b2, g), jnp.abs(g))
        return _finish(p, (coef(-clr, p) * m) / (u + coef(hp["eps"], g)), cfg), AdamaxState(t, m, u)
    u = jnp.maximum(s.u * coef(b2, g), jnp.abs(g) + coef(hp["eps"], g))
    return _finish(p, (coef(-clr, p) * m) / u, cfg), AdamaxState(t, m, u)


# ------------------------------------------------------------------ nadam


def nadam_init(p: Any, cfg: Mapping[str, Any]) -> NAdamState:
    # torch keeps mu_product as a scalar tensor: float64 for float64 parameters, else float32
    scalar = jnp.float64 if p.dtype == jnp.float64 else jnp.float32
    return NAdamState(jnp.zeros([], jnp.int32), zeros(p), zeros(p), jnp.ones([], scalar))


def nadam_update(g, s: NAdamState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, cfg["decoupled"])
    b1, b2 = hp["betas"]
    t = s.step + 1
    tf = float_count(t, hp)
    bc2 = 1 - b2 ** tf
    if cfg["momentum_schedule"]:
        psi = hp["momentum_decay"]
        mu = b1 * (1.0 - 0.5 * 0.96 ** (tf * psi))
        mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((tf + 1) * psi))
    else:
        mu = mu_next = b1
    prod = (s.mu_product * mu.astype(s.mu_product.dtype)).astype(s.mu_product.dtype)
    m = lerp(s.m, g, 1 - b1)
    v = s.v * coef(b2, g) + (coef(1 - b2, g) * g) * g
    prod_f = prod.astype(tf.dtype)
    lr = hp["lr"]
    c1, c2 = -lr * (1.0 - mu) / (1.0 - prod_f), -lr * mu_next / (1.0 - prod_f * mu_next)
    if cfg["eps_hat"]:  # Keras's placement: eps on the raw sqrt(v), sqrt(1 − β2ᵗ) in the step sizes
        denom, c1, c2 = jnp.sqrt(v) + coef(hp["eps"], v), c1 * bc2 ** 0.5, c2 * bc2 ** 0.5
    else:
        denom = jnp.sqrt(v / coef(bc2, v)) + coef(hp["eps"], v)
    new_p = p + (coef(c1, p) * g) / denom
    new_p = new_p + (coef(c2, p) * m) / denom
    return new_p, NAdamState(t, m, v, prod)


# ------------------------------------------------------------------ radam


def radam_init(p: Any, cfg: Mapping[str, Any]) -> AdamState:
    return AdamState(jnp.zeros([], jnp.int32), zeros(p), zeros(p))


def radam_update(g, s: AdamState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, cfg["decoupled"])
    b1, b2 = hp["betas"]
    t = s.step + 1
    tf = float_count(t, hp)
    m = lerp(s.m, g, 1 - b1)
    v = s.v * coef(b2, g) + (coef(1 - b2, g) * g) * g
    bc1, bc2 = 1 - b1 ** tf, 1 - b2 ** tf
    m_hat = m / coef(bc1, m)
    rho_inf = 2 / (1 - b2) - 1
    rho = rho_inf - 2 * tf * (b2 ** tf) / bc2
    rect = ((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)) ** 0.5
    rect = jnp.where(rho > 5.0, rect, 0.0)  # a scalar: NaN where undefined must not reach the blend
    adaptive = coef(bc2 ** 0.5, v) / (jnp.sqrt(v) + coef(hp["eps"], v))
    lr = coef(hp["lr"], p)
    on = _flag(rho > 5.0, p.dtype)  # rectified from rho_t > 5 (torch), else plain momentum
    step = m_hat * lr
    step = ((step * adaptive) * coef(rect, p)) * on + step * (1 - on)
    return _finish(p, -step, cfg), AdamState(t, m, v)


# ------------------------------------------------------------------ lion


def lion_init(p: Any, cfg: Mapping[str, Any]) -> LionState:
    return LionState(jnp.zeros([], jnp.int32), zeros(p))


def lion_update(g, s: LionState, p, hp, cfg):
    g, p, _ = prepare(g, p, cfg)
    g, p = decay(g, p, hp, cfg, True)
    b1, b2 = hp["betas"]
    direction = jnp.sign(s.m * coef(b1, g) + coef(1 - b1, g) * g)
    if cfg.get("cautious"):  # C-Optim, pytorch-optimizer's apply_cautious: per tensor
        mask = (direction * g > 0).astype(g.dtype)
        direction = direction * (mask * (mask.size / (jnp.sum(mask) + 1)))
    m = s.m * coef(b2, g) + coef(1 - b2, g) * g
    return p + coef(-hp["lr"], p) * direction, LionState(s.step + 1, m)


Init = Callable[[Any, Mapping[str, Any]], Any]
Update = Callable[..., tuple[Any, Any]]

LEAVES: dict[str, tuple[Init, Update]] = {
    "sgd": (sgd_init, sgd_update),
    "adam": (adam_init, adam_update),
    "adamw": (adam_init, adam_update),
    "rmsprop": (rmsprop_init, rmsprop_update),
    "adagrad": (adagrad_init, adagrad_update),
    "adamax": (adamax_init, adamax_update),
    "nadam": (nadam_init, nadam_update),
    "radam": (radam_init, radam_update),
    "lion": (lion_init, lion_update),
    "adafactor": (adafactor_init, adafactor_update),
    "muon": (muon_init, muon_update),
    **_schedule_free.OPTIMIZERS,
    **_ademamix.OPTIMIZERS,
}


def init(optimizer: str, p: Any, cfg: Mapping[str, Any]) -> Any:
    """A fresh state for one parameter."""
    return LEAVES[optimizer][0](p, cfg)


def update(optimizer: str, g: Any, s: Any, p: Any, hp: Mapping[str, Any], cfg: Mapping[str, Any]) -> tuple[Any, Any]:
    """(new parameter or Delta(u), new state) after one update, in the parameter's and state's dtypes."""
    new_p, new_s = LEAVES[optimizer][1](g, s, p, hp, cfg)
    if isinstance(new_p, Delta) and p.dtype in (jnp.bfloat16, jnp.float16):
        new_p = p.astype(jnp.float32) + new_p.u  # half precision: round the new parameter once
    elif isinstance(new_p, Delta):
        return Delta(new_p.u.astype(p.dtype)), cast_like(new_s, s)
    return new_p.astype(p.dtype), cast_like(new_s, s)
