"""Keras 3's optimizers for an [optimizer] spec: one optimizer for every variable (Keras has one set of
hyper-parameters; [[optimizer.groups]] are unsupported, `no_weight_decay` is
exclude_from_weight_decay).

sgd → SGD (its buffer holds -lr·g: equal to torch's for a constant lr), adam / adamw → Adam / AdamW
(epsilon hat: ε is added to √v, not √v̂), rmsprop → RMSprop(rho=alpha) (ε inside the root), adagrad →
Adagrad (ε inside the root), adamax → Adamax, nadam → Nadam (Keras's own momentum schedule 0.96^t),
lion → Lion, adafactor → Adafactor, muon → Muon, schedule_free_adamw → ScheduleFreeAdamW (no `r`,
its average weights 1/t: weight_lr_power's default only). `eps_hat` is Keras's own placement on
Adam, AdamW and Adamax (true and the default both run Keras's optimizer; Nadam's is torch's, so
true is unsupported there); Nadam's schedule is `momentum_decay = 1` (other values than that and
torch's default are unsupported). Keras's `weight_decay` is decoupled on every
optimizer (p ← p − p·wd·lr), so torch's coupled L2 weight decay (sgd, adam, rmsprop, adagrad, adamax,
nadam) is unsupported, and decoupled decay (adamw, decoupled_weight_decay, lion, adafactor) is mapped.
Keras has no maximize, dampening, lr_decay, RAdam or SGDScheduleFree. A missing gradient is None
(Keras skips the variable, its iteration count still advances). State: Keras's slot variables
(momentum → m, velocity → v, ...), step = its iteration count. An [ema] is the optimizer's own
`use_ema=True, ema_momentum=decay` (every update from the first: `every` and `start` keep their
defaults).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.config import OptimizerSpec
from conformance.config.ema import EmaSpec
from conformance.rules.groups import resolve_groups
from conformance.rules.trajectory import check_trajectory_inputs
from natives._protocol import gradients, refuse, updates
from natives.keras_backend.backend import dtype_of, load, to_numpy

SLOTS = {  # Keras slot suffix -> neutral name, per optimizer
    "sgd": {"momentum": "momentum_buffer"}, "adam": {"momentum": "m", "velocity": "v", "velocity_hat": "v_max"},
    "rmsprop": {"velocity": "square_avg", "average_gradient": "grad_avg", "momentum": "momentum_buffer"},
    "adagrad": {"accumulator": "sum"}, "adamax": {"momentum": "m", "norm": "u"},
    "nadam": {"momentum": "m", "velocity": "v"}, "lion": {"momentum": "m"}, "adafactor": {}, "muon": {},
    "schedule_free_adamw": {"momentum": "z", "velocity": "v"},
}
SLOTS["adamw"] = SLOTS["adam"]
COUPLED = ("sgd", "adam", "rmsprop", "adagrad", "adamax", "nadam")  # torch's weight_decay is L2 there


def _default(spec: OptimizerSpec, field: str, value: Any, native: str) -> None:
    if getattr(spec, field) not in (None, value):
        raise refuse(f"optimizer.{field} = {getattr(spec, field)!r}", f"{native} has no equivalent")


def build(spec: OptimizerSpec, lr: Any, clip: Mapping[str, Any] | None = None, ema: EmaSpec | None = None) -> Any:
    """The Keras optimizer of the spec at learning rate `lr` (a float or a Keras schedule), with its
    weights' EMA for an [ema]."""
    keras = load()
    O = keras.optimizers
    if spec.groups:
        raise refuse("[[optimizer.groups]]", "a Keras optimizer has one set of hyper-parameters")
    name = spec.name
    if name == "schedule_free_sgd":
        raise refuse("optimizer.name = 'schedule_free_sgd'", "keras.optimizers has ScheduleFreeAdamW only")
    native = f"keras.optimizers ({name})"
    _default(spec, "maximize", False, native)
    _default(spec, "eps_root", 0.0, native)
    _default(spec, "amsgrad_variant", "torch", native)
    _default(spec, "momentum_schedule", True, native)
    _default(spec, "lr_decay", 0.0, native)
    _default(spec, "dampening", 0.0, native)
    _default(spec, "r", 0.0, native)
    _default(spec, "weight_lr_power", 2.0, native)
    _default(spec, "cautious", False, native)
    _default(spec, "cautious_weight_decay", False, native)
    if name == "nadam":
        _default(spec, "eps_hat", False, native)
        if spec.momentum_decay not in (4e-3, 1.0):
            raise refuse(f"optimizer.momentum_decay = {spec.momentum_decay!r}", "keras Nadam's schedule is "
                                                                                 "momentum_decay = 1")
    decoupled = name in ("adamw", "lion", "adafactor", "muon", "schedule_free_adamw") or bool(spec.decoupled_weight_decay)
    if name in COUPLED and not decoupled and spec.weight_decay:
        raise refuse(f"optimizer.weight_decay = {spec.weight_decay} ({name}: torch's L2 decay)",
                     "Keras's weight_decay is decoupled on every optimizer")
    kw: dict[str, Any] = dict(learning_rate=lr, **(clip or {}))
    if ema is not None and ema.enabled:
        if (ema.every, ema.start) != (1, 0):
            raise refuse(f"ema.every = {ema.every}, ema.start = {ema.start}", "Keras's use_ema averages after every "
                                                                             "update from the first")
        kw.update(use_ema=True, ema_momentum=ema.decay)
    if decoupled and spec.weight_decay:
        kw["weight_decay"] = spec.weight_decay
    b1, b2 = spec.betas or (0.9, 0.999)
    if name == "sgd":
        opt = O.SGD(momentum=spec.momentum, nesterov=spec.nesterov, **kw)
    elif name in ("adam", "adamw"):
        opt = (O.AdamW if name == "adamw" else O.Adam)(beta_1=b1, beta_2=b2, epsilon=spec.eps, amsgrad=spec.amsgrad,
                                                      **kw)
    elif name == "rmsprop":
        opt = O.RMSprop(rho=spec.alpha, momentum=spec.momentum, epsilon=spec.eps, centered=spec.centered, **kw)
    elif name == "adagrad":
        opt = O.Adagrad(initial_accumulator_value=spec.initial_accumulator_value, epsilon=spec.eps, **kw)
    elif name == "adamax":
        opt = O.Adamax(beta_1=b1, beta_2=b2, epsilon=spec.eps, **kw)
    elif name == "nadam":
        opt = O.Nadam(beta_1=b1, beta_2=b2, epsilon=spec.eps, **kw)
    elif name == "lion":
        opt = O.Lion(beta_1=b1, beta_2=b2, **kw)
    elif name == "adafactor":
        eps1, eps2 = spec.eps
        opt = O.Adafactor(beta_2_decay=spec.beta2_decay, epsilon_2=eps2, clip_threshold=spec.d,
                          **({"epsilon_1": eps1} if eps1 != "auto" else {}), **kw)
    elif name == "schedule_free_adamw":
        opt = O.ScheduleFreeAdamW(beta_1=b1, beta_2=b2, epsilon=spec.eps, warmup_steps=spec.warmup_steps, **kw)
    elif name == "muon":
        fb = spec.fallback
        opt = O.Muon(momentum=spec.momentum, ns_steps=spec.ns_steps, nesterov=spec.nesterov, epsilon=spec.eps,
                     muon_a=spec.ns_coefficients[0], muon_b=spec.ns_coefficients[1], muon_c=spec.ns_coefficients[2],
                     adam_beta_1=fb.betas[0], adam_beta_2=fb.betas[1], adam_weight_decay=fb.weight_decay,
                     **{**kw, "weight_decay": spec.weight_decay})
    else:
        raise refuse(f"optimizer.name = {name!r}", "keras.optimizers has no such optimizer")
    return opt


def variables(params: Mapping[str, np.ndarray], dtype: str) -> dict[str, Any]:
    keras = load()
    return {k: keras.Variable(np.asarray(v, np.float64), dtype=dtype, name=k) for k, v in params.items()}


def prepare(opt: Any, spec: OptimizerSpec, named: Mapping[str, Any]) -> None:
    """Build the optimizer's slots; exclude the no_weight_decay parameters from its decay."""
    opt.build(list(named.values()))
    if spec.no_weight_decay:
        shapes = {k: tuple(v.shape) for k, v in named.items()}
        off = [n for g in resolve_groups(spec, shapes) if not g.decay for n in g.names]
        opt.exclude_from_weight_decay(var_list=[named[n] for n in off])


def apply(opt: Any, named: Mapping[str, Any], grads: Mapping[str, np.ndarray | None], dtype: str) -> None:
    """One optimizer.apply_gradients call (None: no gradient for that variable)."""
    import jax.numpy as jnp

    pairs = [(None if grads.get(k) is None else jnp.asarray(grads[k], dtype), v) for k, v in named.items()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras warns about the variables without a gradient
        opt.apply_gradients(pairs)


def export_state(opt: Any, name: str, named: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    slots = SLOTS.get(name, {})
    step = int(np.asarray(opt.iterations.value))
    out: dict[str, dict[str, Any]] = {k: {"step": step} for k in named}
    prefix = f"{opt.name}/"
    for var in opt.variables:
        path = var.path.removeprefix(prefix)
        for param in named:
            suffix = path.removeprefix(param + "_")
            if path.startswith(param + "_") and suffix in slots:
                out[param][slots[suffix]] = to_numpy(var.value)
    return out


def run_trajectory(spec: OptimizerSpec, params: Mapping[str, np.ndarray], grads: Sequence[Mapping[str, Any]] | None = None,
                   objective: Mapping[str, Any] | None = None, steps: int | None = None, dtype: str = "float64",
                   state: Mapping[str, Mapping[str, Any]] | None = None,
                   ema: EmaSpec | None = None) -> dict[str, list[Any]]:
    """The Keras optimizer applied to the case's gradients: parameters and neutral state per update,
    and with [ema] Keras's moving average of the variables."""
    check_trajectory_inputs(spec, params, grads, objective, steps, state)
    if state:
        raise refuse("a start state (inputs.state)", "not mapped onto Keras's slot variables")
    dt = dtype_of(dtype)
    resolve_groups(spec, {k: np.shape(v) for k, v in params.items()})  # the group errors, as every backend
    opt = build(spec, spec.lr, ema=ema)
    named = variables(params, dt)
    prepare(opt, spec, named)
    out: dict[str, list[Any]] = {"params": [], "state": [], "ema": []}
    for t in range(updates(grads, steps)):
        current = {k: to_numpy(v.value) for k, v in named.items()}
        apply(opt, named, gradients(t, list(named), current, grads, objective), dt)
        out["params"].append({k: to_numpy(v.value) for k, v in named.items()})
        out["state"].append(export_state(opt, spec.name, named))
        if opt.use_ema:
            out["ema"].append({k: to_numpy(a.value) for k, a in zip(named, opt._model_variables_moving_average)})
    return out
