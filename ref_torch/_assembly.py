"""How an optimizer spec becomes the framework's optimizer: each parameter group
(conformance.rules.groups.resolve_groups, in that order) in the form the framework's optimizer
takes it (`group_options`), and one optimizer over all the groups (`make`). Zero-size parameters are
not given to the optimizer: they have nothing to update, and torch's Adafactor divides by their size.
"""

# torch: torch.optim objects (the built-in class, with foreach/fused kernels, or ref_torch._elementwise's
# where torch.optim has none), and torch's state names mapped to the neutral ones (docs/contract.md §4).

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim.optimizer import _get_scalar_dtype

from conformance.config.optimizer import OptimizerSpec
from conformance.rules.groups import ParamGroup, resolve_groups
from ref_torch import _ademamix, _elementwise, _muon, _prodigy, _schedule_free

# torch state key -> neutral name, per optimizer
STATE_NAMES: dict[str, dict[str, str]] = {
    "sgd": {"step": "step", "momentum_buffer": "momentum_buffer"},
    "adam": {"step": "step", "exp_avg": "m", "exp_avg_sq": "v", "max_exp_avg_sq": "v_max"},
    "rmsprop": {"step": "step", "square_avg": "square_avg", "grad_avg": "grad_avg",
                "momentum_buffer": "momentum_buffer"},
    "adagrad": {"step": "step", "sum": "sum"},
    "adamax": {"step": "step", "exp_avg": "m", "exp_inf": "u"},
    "nadam": {"step": "step", "exp_avg": "m", "exp_avg_sq": "v", "mu_product": "mu_product"},
    "radam": {"step": "step", "exp_avg": "m", "exp_avg_sq": "v"},
    "lion": {"step": "step", "exp_avg": "m"},
    "adafactor": {"step": "step", "row_var": "row_var", "col_var": "col_var", "variance": "variance"},
    "muon": {"step": "step", "momentum_buffer": "momentum_buffer"},
    "schedule_free_adamw": {"step": "step", "z": "z", "exp_avg_sq": "v", "weight_sum": "weight_sum",
                            "lr_max": "lr_max"},
    "schedule_free_sgd": {"step": "step", "z": "z", "weight_sum": "weight_sum", "lr_max": "lr_max"},
    "ademamix": {"step": "step", "exp_avg_fast": "m", "exp_avg_slow": "m_slow", "exp_avg_sq": "v"},
    "prodigy": {"step": "step", "exp_avg": "m", "exp_avg_sq": "v", "s": "s", "p0": "p0", "d": "d", "d_max": "d_max",
                "d_numerator": "d_numerator", "k": "k"},
}
STATE_NAMES["adamw"] = STATE_NAMES["adam"]

NADAM_SCHEDULE_OFF = 1e9  # 0.96 ** (t * 1e9) underflows to 0, so torch's mu_t is exactly beta1
FUSED = ("sgd", "adam", "adamw", "adagrad")  # torch.optim classes with fused kernels


def neutral_names(optimizer: str, group: dict[str, Any]) -> dict[str, str]:
    """torch state key -> neutral name for a group of `optimizer`."""
    names = dict(STATE_NAMES[optimizer])
    if optimizer in ("adam", "adamw") and group.get("amsgrad_variant", "torch") == "optax":
        names["max_exp_avg_sq"] = "v_hat_max"
    return names


def group_options(group: ParamGroup) -> Any:
    """A parameter group's hyper-parameters in the form the framework's optimizer takes them (torch:
    the constructor's keyword arguments, twinstep's extra fields kept for its own classes; JAX:
    (dynamic, static), the settable floats and the static options with those derived from them)."""
    hp = dict(group.hyperparams)
    name = group.optimizer
    if name == "nadam":
        schedule = hp.pop("momentum_schedule")
        if not schedule:
            hp["momentum_decay"] = NADAM_SCHEDULE_OFF
    if name == "adafactor":
        eps1, eps2 = hp["eps"]
        hp["eps"] = (None if eps1 == "auto" else eps1, eps2)
    if name == "muon":
        hp["ns_dtype"] = getattr(torch, hp["ns_dtype"])
    if name == "adamw":
        hp["decoupled_weight_decay"] = True  # what torch.optim.AdamW sets; read by AdamVariants too
    return hp


def optimizer_class(name: str, groups: list[dict[str, Any]]) -> tuple[Callable[..., Any], set[str]]:
    """The class for `name` given its groups, and the twinstep-only keys it must not receive."""
    if name == "lion":
        return _elementwise.Lion, set()
    for private in (_ademamix, _prodigy, _schedule_free):
        if name in private.OPTIMIZERS:
            return private.OPTIMIZERS[name], set()
    decoupled = any(g.get("decoupled_weight_decay") for g in groups)
    if name in ("adam", "adamw"):
        if any(g["eps_root"] != 0 or g["eps_hat"] or (g["amsgrad"] and g["amsgrad_variant"] != "torch")
               for g in groups):
            return _elementwise.AdamVariants, set()
        return (torch.optim.Adam if name == "adam" else torch.optim.AdamW), {"eps_root", "amsgrad_variant", "eps_hat"}
    if name == "rmsprop":
        if any(g["eps_in_sqrt"] for g in groups):
            return _elementwise.RMSpropEpsInSqrt, set()
        return (_elementwise.DecoupledRMSprop if decoupled else torch.optim.RMSprop), {"eps_in_sqrt"}
    if name == "adagrad":
        if any(g["eps_in_sqrt"] for g in groups):
            return _elementwise.AdagradEpsInSqrt, set()
        return (_elementwise.DecoupledAdagrad if decoupled else torch.optim.Adagrad), {"eps_in_sqrt"}
    if name == "adamax":
        if any(g["eps_hat"] for g in groups):
            return _elementwise.AdamaxEpsHat, set()
        return (_elementwise.DecoupledAdamax if decoupled else torch.optim.Adamax), {"eps_hat"}
    if name == "nadam":
        if any(g["eps_hat"] for g in groups):
            return _elementwise.NAdamEpsHat, set()
        return torch.optim.NAdam, {"eps_hat"}
    if name == "sgd" and decoupled:
        return _elementwise.DecoupledSGD, set()
    if name == "muon":
        if any(g["ns_dtype"] != torch.bfloat16 for g in groups):
            return _muon.FloatMuon, set()
        return torch.optim.Muon, {"ns_dtype"}
    classes = {"sgd": torch.optim.SGD, "radam": torch.optim.RAdam, "adafactor": torch.optim.Adafactor}
    return classes[name], set()


def kernel_options(name: str, cls: Any, params: list[torch.Tensor], impl: str) -> dict[str, Any]:
    """foreach/fused flags: "auto" is fused (else foreach) on CUDA and torch's default elsewhere."""
    if issubclass(cls, _elementwise.DecoupledDecay):
        cls = cls.__mro__[2]  # the torch.optim class behind the decoupled decay
    if cls not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop,
                   torch.optim.Adagrad, torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam,
                   torch.optim.Adafactor):
        return {}
    if impl == "auto":
        cuda = bool(params) and all(p.is_cuda for p in params)
        impl = ("fused" if name in FUSED else "foreach") if cuda else "default"
    if impl == "fused" and name in FUSED:
        return {"fused": True}
    if impl in ("foreach", "fused"):
        return {"foreach": True}
    if impl == "single":
        return {"foreach": False}
    return {}


def make_single(name: str, groups: list[dict[str, Any]], impl: str) -> torch.optim.Optimizer:
    """A torch optimizer of one kind over group dicts that already hold every hyper-parameter."""
    cls, drop = optimizer_class(name, groups)
    for g in groups:
        for key in drop:
            g.pop(key, None)
    params = [p for g in groups for p in g["params"]]
    opt = cls(groups, **kernel_options(name, cls, params, impl))
    if cls is torch.optim.NAdam:
        opt.register_step_pre_hook(_float64_mu_product)
    if name in ("sgd", "muon"):
        opt.register_step_post_hook(_count_steps)
    if any(g.get("cautious_weight_decay") for g in groups):
        cautious_weight_decay(opt)
    return opt


def _float64_mu_product(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    # torch keeps NAdam's mu_product in float32 unless the *global* default dtype is float64; a
    # float64 parameter gets a float64 product here, so float64 runs are exact whatever the default
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None and p.dtype == torch.float64 and len(opt.state[p]) == 0:
                device = p.device if group["capturable"] else None
                opt.state[p].update(
                    step=torch.zeros((), dtype=_get_scalar_dtype(), device=device),
                    mu_product=torch.ones((), dtype=torch.float64, device=device),
                    exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                    exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format),
                )


def _count_steps(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    # SGD and Muon keep no update count; twinstep's neutral state has one per parameter
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                state = opt.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                state["step"] += 1


def make(spec: OptimizerSpec, named_params: Any, impl: str = "auto") -> torch.optim.Optimizer:
    """The optimizer of `spec` over the named parameters (torch: a torch.optim.Optimizer whose
    param_groups carry `param_names`, `impl` choosing its kernels: "auto", "default", "single",
    "foreach" or "fused"; JAX: the optax transform over a {name: array} dict and its static Plan)."""
    named = dict(named_params.items() if isinstance(named_params, Mapping) else named_params)
    groups = resolve_groups(spec, {k: tuple(v.shape) for k, v in named.items()})
    dicts = []
    for g in groups:
        kept = [n for n in g.names if named[n].numel() > 0]
        d = {"params": [named[n] for n in kept], "param_names": kept, **group_options(g),
             "label": g.label, "optimizer_name": g.optimizer}
        if spec.name == "muon":
            d["use_muon"] = not g.fallback
        dicts.append(d)
    if spec.name != "muon":
        opt = make_single(spec.name, dicts, impl)
    else:
        fb = spec.fallback.name  # type: ignore[union-attr]
        opt = _muon.MuonWithFallback(dicts, lambda gs: make_single("muon", gs, impl),
                                     lambda gs: make_single(fb, gs, impl))
    # torch.optim.Adagrad fills every accumulator with the constructor's initial_accumulator_value
    # and ignores a group's own; twinstep honours the group's
    for group in opt.param_groups:
        if group["optimizer_name"] == "adagrad":
            for p in group["params"]:
                opt.state[p] = fresh_adagrad(p, group)
    return opt


def fresh_adagrad(p: torch.Tensor, group: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Adagrad's state before the first update of `p`, from its own group's initial_accumulator_value."""
    fused = bool(group.get("fused"))
    step = torch.zeros((), dtype=_get_scalar_dtype(is_fused=fused), device=p.device if fused else None)
    return {"step": step, "sum": torch.full_like(p, group["initial_accumulator_value"],
                                                 memory_format=torch.preserve_format)}


def cautious_weight_decay(opt: torch.optim.Optimizer) -> None:
    """Cautious weight decay for the groups that set it: the step runs without its decoupled decay,
    then p ← p − lr·wd·p₀·[(p₀ − p)·p₀ ≥ 0] with p₀ the parameter before the step (the decay only
    where the step moved it toward zero; heavyball's cautious_weight_decay, nanochat's Muon)."""
    held: list[tuple[dict[str, Any], float, list[torch.Tensor], list[torch.Tensor]]] = []

    def before(o: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in o.param_groups:
            if group.get("cautious_weight_decay") and group["weight_decay"] != 0:
                params = [p for p in group["params"] if p.grad is not None]
                held.append((group, group["weight_decay"], params, [p.detach().clone() for p in params]))
                group["weight_decay"] = 0.0

    def after(o: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group, wd, params, start in held:
            group["weight_decay"] = wd
            with torch.no_grad():
                for p, p0 in zip(params, start):
                    p.sub_(p0 * ((p0 - p) * p0 >= 0), alpha=group["lr"] * wd)
        held.clear()

    opt.register_step_pre_hook(before)
    opt.register_step_post_hook(after)
