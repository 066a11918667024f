"""optax's aliases for an [optimizer] spec, as docs/divergences.md#optimizers ports each torch class:

sgd → optax.sgd (dampening: none in optax); adam → optax.adam (optax.amsgrad with amsgrad), torch's
L2 weight decay as chain(add_decayed_weights, ...) in front; adamw and decoupled_weight_decay →
optax.adamw / nadamw, or chain(scale_by_*, add_decayed_weights, scale_by_learning_rate) (sgd: trace;
rmsprop: scale_by_rms / scale_by_stddev, then trace; adagrad: scale_by_rss; adamax:
scale_by_adamax; radam: scale_by_radam); rmsprop →
optax.rmsprop(decay=alpha, eps_in_sqrt=...); adagrad → optax.adagrad (torch's lr_decay as the
learning-rate function lr / (1 + count·lr_decay), torch's formula); adamax, nadam, radam, lion →
their aliases; adafactor → optax.adafactor(decay_rate=-beta2_decay, clipping_threshold=d,
weight_decay_rate=lr·weight_decay); muon → optax.contrib.muon with its own Adam for the rest;
maximize → scale(-1) first; schedule_free_adamw / schedule_free_sgd →
optax.contrib.schedule_free_adamw / schedule_free_sgd (its params are the y point; no `r`); ademamix →
optax.contrib.ademamix with apple/ml-ademamix's warm-ups as b3 / alpha functions of count + 1
(optax reads them before its increment); prodigy → optax.contrib.prodigy (one group, no growth_rate;
always bias-corrected: PR-BC; decouple = false as add_decayed_weights in front). optax
has no `eps_hat` (its eps is torch's placement) and no `momentum_decay`: other values than torch's
are unsupported. [schedule.hyper] is optax.inject_hyperparams around sgd / adam / adamw with the
keys' schedules as momentum, b1, b2 and weight_decay. Parameter groups are optax.multi_transform over the groups of
conformance.rules.groups. An [ema] is optax.ema(decay) (debiased, its default) over the parameters
after each due update.

optax has one update count for the whole tree and updates every leaf: a parameter missing from an
update's gradients gets a zero gradient. The state is exported from optax's state tuples (mu → m,
nu → v, ...) with `step` = optax's count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from conformance.config import OptimizerSpec
from conformance.config.ema import EmaSpec
from conformance.rules.groups import ParamGroup, resolve_groups
from conformance.rules.state import check_state
from conformance.rules.trajectory import check_trajectory_inputs
from natives._protocol import ema_due, gradients, refuse, updates
from natives.optax_native.backend import dtype_of, to_numpy
from natives.optax_native.state import export, field_names, load

LR = float | Callable[[Any], Any]


def _refuse_extra(hp: Mapping[str, Any], key: str, default: Any, native: str) -> None:
    if key in hp and hp[key] != default:
        raise refuse(f"optimizer.{key} = {hp[key]!r}", f"{native} has no equivalent")


def transform(name: str, hp: Mapping[str, Any], lr: LR) -> optax.GradientTransformation:
    """The optax optimizer of one group (hyper-parameters in torch's vocabulary), at lr `lr`."""
    wd = hp.get("weight_decay", 0.0)
    b1, b2 = hp.get("betas", (0.9, 0.999))
    eps = hp.get("eps")
    _refuse_extra(hp, "eps_hat", False, f"optax.{name} (its eps is added to the bias-corrected root)")
    _refuse_extra(hp, "cautious", False, f"optax.{name} (no cautious masking)")
    _refuse_extra(hp, "cautious_weight_decay", False, "optax.add_decayed_weights (it decays every entry)")
    coupled = 0.0  # torch's L2 weight decay: add_decayed_weights in front of the alias
    if hp.get("decoupled_weight_decay") and name in DECOUPLED_CORE:
        return _maximize(hp, optax.chain(*DECOUPLED_CORE[name](hp), optax.add_decayed_weights(wd),
                                         optax.scale_by_learning_rate(_decayed_lr(hp, lr))))
    if name in ("schedule_free_adamw", "schedule_free_sgd"):
        return _maximize(hp, _schedule_free(name, hp, lr))
    if name == "sgd":
        _refuse_extra(hp, "dampening", 0.0, "optax.sgd (dampening)")
        core, coupled = optax.sgd(lr, momentum=hp["momentum"] or None, nesterov=hp["nesterov"]), wd
    elif name in ("adam", "adamw"):
        decoupled = name == "adamw" or hp.get("decoupled_weight_decay", False)
        if hp["amsgrad"]:
            raw = hp["amsgrad_variant"] == "optax_raw"
            if decoupled:
                core = optax.chain(optax.scale_by_amsgrad(b1, b2, eps, hp["eps_root"], bias_correction_nu=not raw),
                                   optax.add_decayed_weights(wd), optax.scale_by_learning_rate(lr))
            else:
                core, coupled = optax.amsgrad(lr, b1, b2, eps, hp["eps_root"], bias_correction_nu=not raw), wd
        elif decoupled:
            core = optax.adamw(lr, b1, b2, eps, hp["eps_root"], weight_decay=wd)
        else:
            core, coupled = optax.adam(lr, b1, b2, eps, hp["eps_root"]), wd
    elif name == "rmsprop":
        core = optax.rmsprop(lr, decay=hp["alpha"], eps=eps, eps_in_sqrt=hp["eps_in_sqrt"], centered=hp["centered"],
                             momentum=hp["momentum"] or None)
        coupled = wd
    elif name == "adagrad":
        core = optax.adagrad(_decayed_lr(hp, lr), initial_accumulator_value=hp["initial_accumulator_value"], eps=eps)
        coupled = wd
    elif name == "adamax":
        core, coupled = optax.adamax(lr, b1, b2, eps), wd
    elif name == "nadam":
        if hp["momentum_schedule"]:
            _refuse_extra(hp, "momentum_decay", 4e-3, "optax.nadam (momentum_decay)")
        if hp["decoupled_weight_decay"]:
            core = optax.nadamw(lr, b1, b2, eps, weight_decay=wd)
        else:
            core, coupled = optax.nadam(lr, b1, b2, eps), wd
    elif name == "radam":
        if hp["decoupled_weight_decay"]:
            core = optax.chain(optax.scale_by_radam(b1, b2, eps), optax.add_decayed_weights(wd),
                               optax.scale_by_learning_rate(lr))
        else:
            core, coupled = optax.radam(lr, b1, b2, eps), wd
    elif name == "lion":
        core = optax.lion(lr, b1, b2, weight_decay=wd)
    elif name == "adafactor":
        core = _adafactor(hp, lr)
    elif name == "ademamix":
        b3, alpha = _ademamix_warmups(hp)
        core = optax.contrib.ademamix(lr, b1, b2, b3, alpha, eps, weight_decay=wd)
    elif name == "prodigy":  # always bias-corrected (PR-BC); prodigyopt's L2 decay is add_decayed_weights in front
        _refuse_extra(hp, "growth_rate", math.inf, "optax.contrib.prodigy (no cap on d's growth)")
        core = optax.contrib.prodigy(lr, (b1, b2), hp["beta3"], eps, estim_lr0=hp["d0"], estim_lr_coef=hp["d_coef"],
                                     weight_decay=wd if hp["decouple"] else 0.0,
                                     safeguard_warmup=hp["safeguard_warmup"])
        coupled = 0.0 if hp["decouple"] else wd
    else:
        raise refuse(f"optimizer.name = {name!r}", "no optax alias is mapped")
    return _maximize(hp, optax.chain(optax.add_decayed_weights(coupled), core) if coupled else core)


def _ademamix_warmups(hp: Mapping[str, Any]) -> tuple[Any, Any]:
    """apple/ml-ademamix's warm-ups of β3 and α as functions of optax's count, which
    optax.contrib.ademamix reads before its increment (the reference's t is count + 1); constants
    without a warm-up."""
    b1, b3, alpha = hp["betas"][0], hp["beta3"], hp["alpha"]
    tb, ta = hp["beta3_warmup"], hp["alpha_warmup"]

    def half_life(beta: float) -> Any:
        return jnp.log(0.5) / jnp.log(beta + 1e-8) - 1

    def b3_at(count: Any) -> Any:
        a = (count + 1.0) / tb
        return jnp.where(count + 1 < tb, 0.5 ** (1 / ((1 - a) * half_life(b1) + a * half_life(b3) + 1)), b3)

    def alpha_at(count: Any) -> Any:
        return jnp.where(count + 1 < ta, (count + 1.0) / ta * alpha, alpha)

    return (b3_at if tb else b3), (alpha_at if ta else alpha)


def _maximize(hp: Mapping[str, Any], tx: optax.GradientTransformation) -> optax.GradientTransformation:
    return optax.chain(optax.scale(-1.0), tx) if hp.get("maximize") else tx  # torch negates before the decay


def _decayed_lr(hp: Mapping[str, Any], lr: LR) -> LR:
    """adagrad's lr_decay as the learning-rate function lr / (1 + count·lr_decay) (torch's formula)."""
    if not hp.get("lr_decay"):
        return lr
    if callable(lr):
        raise refuse("optimizer.lr_decay with a [schedule]", "optax.adagrad takes one learning-rate function")
    base, decay = lr, hp["lr_decay"]
    return lambda count: base / (1 + count * decay)


# the scale_by_* part of each alias whose torch decay is coupled, for decoupled_weight_decay:
# chain(core, add_decayed_weights(wd), scale_by_learning_rate(lr)) as optax.adamw is built
DECOUPLED_CORE: dict[str, Callable[[Mapping[str, Any]], list[optax.GradientTransformation]]] = {
    "sgd": lambda hp: [optax.trace(hp["momentum"], hp["nesterov"])] if hp["momentum"] else [],
    "rmsprop": lambda hp: [
        (optax.scale_by_stddev if hp["centered"] else optax.scale_by_rms)(hp["alpha"], hp["eps"],
                                                                           eps_in_sqrt=hp["eps_in_sqrt"]),
        *([optax.trace(hp["momentum"])] if hp["momentum"] else [])],
    "adagrad": lambda hp: [optax.scale_by_rss(hp["initial_accumulator_value"], hp["eps"])],
    "adamax": lambda hp: [optax.scale_by_adamax(*hp["betas"], hp["eps"])],
}


def _schedule_free(name: str, hp: Mapping[str, Any], lr: LR) -> optax.GradientTransformation:
    """optax.contrib's schedule-free optimizers (optax has no `r`)."""
    _refuse_extra(hp, "r", 0.0, f"optax.contrib.{name}")
    warmup = hp["warmup_steps"] or None
    if name == "schedule_free_adamw":
        return optax.contrib.schedule_free_adamw(lr, warmup, *hp["betas"], hp["eps"], hp["weight_decay"],
                                                 hp["weight_lr_power"])
    return optax.contrib.schedule_free_sgd(lr, warmup, hp["momentum"], hp["weight_decay"] or None,
                                           hp["weight_lr_power"])


def _adafactor(hp: Mapping[str, Any], lr: LR) -> optax.GradientTransformation:
    _refuse_extra(hp, "eps", ("auto", 1e-3), "optax.adafactor (eps)")
    wd = hp["weight_decay"]
    if wd and callable(lr):
        raise refuse("optimizer.weight_decay with a [schedule]", "optax.adafactor's weight_decay_rate is not "
                                                                  "multiplied by the lr")
    return optax.adafactor(learning_rate=lr, decay_rate=-hp["beta2_decay"], clipping_threshold=hp["d"],
                           weight_decay_rate=lr * wd if wd else None)


def _muon(spec: OptimizerSpec, lr: LR) -> optax.GradientTransformation:
    """optax.contrib.muon, which routes the non-matrix parameters to its own Adam."""
    if spec.groups or spec.no_weight_decay or spec.fallback_params:
        raise refuse("muon with groups, no_weight_decay or fallback_params", "optax.contrib.muon routes by shape")
    fb = spec.fallback
    if fb is None or fb.name != "adamw" or fb.amsgrad or fb.lr != spec.lr:
        raise refuse("optimizer.fallback", "optax.contrib.muon's own Adam is AdamW at the Muon lr")
    _refuse_extra(spec.overrides(), "adjust_lr_fn", "original", "optax.contrib.muon")
    for part in (spec, fb):
        _refuse_extra(part.overrides(), "cautious_weight_decay", False, "optax.contrib.muon (it decays every entry)")
    return optax.contrib.muon(lr, ns_coeffs=spec.ns_coefficients, ns_steps=spec.ns_steps, beta=spec.momentum,
                              eps=spec.eps, weight_decay=spec.weight_decay, nesterov=spec.nesterov,
                              adam_b1=fb.betas[0], adam_b2=fb.betas[1], adam_eps_root=fb.eps_root,
                              adam_weight_decay=fb.weight_decay)


def build(spec: OptimizerSpec, groups: Sequence[ParamGroup], lrs: Sequence[LR] | None = None,
          hyper: Mapping[str, Sequence[Any]] | None = None) -> optax.GradientTransformation:
    """The optax optimizer of the spec: one alias, or optax.multi_transform over the groups (`lrs`: each
    group's learning rate or schedule; default its lr; `hyper`: [schedule.hyper]'s schedules, one per
    group or None, through optax.inject_hyperparams)."""
    lrs = [g.hyperparams["lr"] for g in groups] if lrs is None else lrs
    if spec.name == "muon":
        if hyper:
            raise refuse(f"schedule.hyper ({', '.join(hyper)}) with muon", "optax.contrib.muon is not mapped with "
                                                                            "inject_hyperparams")
        return _muon(spec, lrs[-1])

    def of(i: int, g: ParamGroup) -> optax.GradientTransformation:
        scheduled = {k: fns[i] for k, fns in (hyper or {}).items() if fns[i] is not None}
        return injected(g.optimizer, g.hyperparams, lrs[i], scheduled) if scheduled else \
            transform(g.optimizer, g.hyperparams, lrs[i])

    used = [(i, g) for i, g in enumerate(groups) if g.names]
    if spec.name == "prodigy" and len(used) > 1:
        raise refuse("prodigy with several parameter groups", "optax.contrib.prodigy inside multi_transform "
                                                               "estimates one d per group, prodigyopt one for all")
    if len(used) == 1:
        return of(*used[0])
    labels = {n: g.label for g in groups for n in g.names}
    return optax.multi_transform({g.label: of(i, g) for i, g in used}, labels)


# inject_hyperparams's names for [schedule.hyper]'s keys, per alias it wraps
INJECTED = {"sgd": {"momentum": "momentum"}, "adam": {"beta1": "b1", "beta2": "b2", "eps": "eps"},
            "adamw": {"beta1": "b1", "beta2": "b2", "weight_decay": "weight_decay", "eps": "eps"}}


def injected(name: str, hp: Mapping[str, Any], lr: LR, scheduled: Mapping[str, Any]) -> optax.GradientTransformation:
    """optax.inject_hyperparams(alias)(...) for a group whose [schedule.hyper] keys are `scheduled`
    ({key: schedule of the count}), as an optax user schedules b1 or the weight decay."""
    names = INJECTED.get(name, {})
    plain = name in INJECTED and not hp.get("maximize") and not hp.get("amsgrad") and not hp.get("decoupled_weight_decay")
    if not plain or set(scheduled) - set(names) or (name != "adamw" and hp.get("weight_decay")):
        raise refuse(f"schedule.hyper ({', '.join(scheduled)}) with optimizer {name!r}",
                     "mapped onto inject_hyperparams for sgd's momentum, adam's / adamw's b1, b2 and eps, and "
                     "adamw's weight_decay, without coupled decay, maximize or amsgrad")
    _refuse_extra(hp, "eps_hat", False, f"optax.{name} (its eps is added to the bias-corrected root)")
    fixed: dict[str, Any] = {"learning_rate": lr}
    if name == "sgd":
        _refuse_extra(hp, "dampening", 0.0, "optax.sgd (dampening)")
        fixed.update(momentum=hp["momentum"], nesterov=hp["nesterov"])
        alias, static = optax.sgd, ("nesterov",)
    else:
        fixed.update(b1=hp["betas"][0], b2=hp["betas"][1], eps=hp["eps"], eps_root=hp["eps_root"])
        if name == "adamw":
            fixed["weight_decay"] = hp["weight_decay"]
        alias, static = (optax.adamw if name == "adamw" else optax.adam), ()
    fixed.update({names[k]: fn for k, fn in scheduled.items()})
    return optax.inject_hyperparams(alias, static_args=static)(**fixed)


def _apply(tx: optax.GradientTransformation, g: Any, s: Any, p: Any) -> tuple[Any, Any]:
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s


def run_trajectory(spec: OptimizerSpec, params: Mapping[str, np.ndarray], grads: Sequence[Mapping[str, Any]] | None = None,
                   objective: Mapping[str, Any] | None = None, steps: int | None = None, dtype: str = "float64",
                   state: Mapping[str, Mapping[str, Any]] | None = None,
                   ema: EmaSpec | None = None) -> dict[str, list[Any]]:
    """The optax optimizer stepped over the case's gradients (a missing gradient is a zero gradient):
    parameters and neutral state after each update, and with [ema] optax.ema's average of the
    parameters ({} before its first update)."""
    check_trajectory_inputs(spec, params, grads, objective, steps, state)
    dt = dtype_of(dtype)
    shapes = {k: np.shape(v) for k, v in params.items()}
    groups = resolve_groups(spec, shapes)
    tx = build(spec, groups)
    p = {k: jnp.asarray(np.asarray(v, np.float64), dt) for k, v in params.items()}
    opt_state = tx.init(p)
    names = field_names(spec.name, spec.amsgrad_variant or "torch")
    if state:
        check_state(groups, shapes, state)
        opt_state = load(opt_state, names, state, dt)
    start = int(next(iter(state.values()))["step"]) if state else 0
    average = optax.ema(ema.decay) if ema is not None and ema.enabled else None
    avg_state, avg = (average.init(p), {}) if average is not None else (None, {})
    out: dict[str, list[Any]] = {"params": [], "state": [], "ema": []}
    for t in range(updates(grads, steps)):
        current = {k: to_numpy(v) for k, v in p.items()}
        g = {k: jnp.zeros_like(p[k]) if v is None else jnp.asarray(v, dt)
             for k, v in gradients(t, list(p), current, grads, objective).items()}
        p, opt_state = _apply(tx, g, opt_state, p)
        out["params"].append({k: to_numpy(v) for k, v in p.items()})
        out["state"].append(export(opt_state, names, list(p), start + t + 1))
        if average is not None and ema_due(ema, t):
            avg, avg_state = average.update(p, avg_state)
        out["ema"].append({k: to_numpy(v) for k, v in avg.items()})
    return out
