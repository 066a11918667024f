"""Read a torch.optim optimizer into the neutral `[optimizer]` section (torch is imported lazily).

Every group's hyper-parameters are read from `optimizer.param_groups` (torch has already filled in
its defaults there); the last group becomes the top-level values (twinstep's default group) and
each earlier group an `[[optimizer.groups]]` entry with the fields it changes and glob patterns
over the parameter names, so group order, and every per-group list, is torch's. Kernel choices
(foreach, fused, capturable) compute the same formulas and are not part of the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conformance.errors import ConfigError, UnsupportedError
from conformance.port.read.patterns import cover

# torch.optim class -> (spec name, the group keys its step reads, in the spec's vocabulary)
CLASSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "SGD": ("sgd", ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize")),
    "Adam": ("adam", ("lr", "betas", "eps", "weight_decay", "amsgrad", "decoupled_weight_decay", "maximize")),
    "AdamW": ("adamw", ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")),
    "RMSprop": ("rmsprop", ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize")),
    "Adagrad": ("adagrad", ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "maximize")),
    "Adamax": ("adamax", ("lr", "betas", "eps", "weight_decay", "maximize")),
    "NAdam": ("nadam", ("lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay",
                        "maximize")),
    "RAdam": ("radam", ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "maximize")),
    "Adafactor": ("adafactor", ("lr", "beta2_decay", "eps", "d", "weight_decay", "maximize")),
    "Muon": ("muon", ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
                      "adjust_lr_fn")),
    # the schedulefree package's (its update counts per group: SF-COUNT)
    "AdamWScheduleFree": ("schedule_free_adamw", ("lr", "betas", "eps", "weight_decay", "warmup_steps", "r",
                                                  "weight_lr_power")),
    "SGDScheduleFree": ("schedule_free_sgd", ("lr", "momentum", "weight_decay", "warmup_steps", "r",
                                              "weight_lr_power")),
}
PACKAGES = {"AdamWScheduleFree": "schedulefree", "SGDScheduleFree": "schedulefree"}  # others: torch.optim
KERNEL_KEYS = ("foreach", "fused", "capturable")  # same formulas, another kernel (O-KERNELS)
SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum")
INT_KEYS = ("ns_steps", "warmup_steps")


def _home(name: str) -> Any:
    """The module a class of CLASSES must come from (torch.optim, or the schedulefree package)."""
    import importlib

    try:
        return importlib.import_module(PACKAGES.get(name, "torch.optim"))
    except ImportError:
        return None


def optimizer_name(optimizer: Any) -> str:
    """The spec name of a torch.optim (or schedulefree) optimizer; UnsupportedError for any other class."""
    import torch

    cls = type(optimizer)
    entry = CLASSES.get(cls.__name__)
    if entry is not None and cls.__name__ in PACKAGES and getattr(_home(cls.__name__), cls.__name__, None) is cls:
        return entry[0]
    if entry is None or getattr(torch.optim, cls.__name__, None) is not cls:
        base = next((b for b in cls.__mro__[1:] if b.__name__ in CLASSES
                     and getattr(torch.optim, b.__name__, None) is b), None)
        where = f"optimizer class {cls.__module__}.{cls.__qualname__} cannot be translated"
        if base is None:
            raise UnsupportedError(f"{where}: twinstep's optimizers are "
                                   f"{', '.join('torch.optim.' + k for k in CLASSES)}")
        changed = _step_overrides(cls, base)  # (an lr_scheduler wraps the instance's step: that is torch's own)
        if changed:
            raise UnsupportedError(f"{where}: it overrides {changed[0]} of torch.optim.{base.__name__}, which may "
                                   f"change its step")
        return CLASSES[base.__name__][0]  # a subclass that changes nothing the step does: its base class
    return entry[0]


# What a subclass may redefine without changing the step: construction (the groups are read as they
# are) and bookkeeping around it; anything else the base class defines may be the mathematics.
HARMLESS = frozenset({"__init__", "__repr__", "__getstate__", "__setstate__", "zero_grad", "state_dict",
                      "load_state_dict", "__doc__", "__module__", "__qualname__", "__dict__", "__weakref__",
                      "__annotations__", "__firstlineno__", "__static_attributes__", "__orig_bases__",
                      "__parameters__"})


def _step_overrides(cls: type, base: type) -> list[str]:
    """The names the classes between `cls` and `base` redefine that the step may use."""
    names = [n for c in cls.__mro__[:cls.__mro__.index(base)] for n in vars(c) if n not in HARMLESS and hasattr(base, n)]
    return list(dict.fromkeys(names))


def _float(value: Any, where: str) -> float:
    try:
        return float(value)  # tensors (capturable lr) and ints (torch's 0 defaults) alike
    except (TypeError, ValueError):
        raise ConfigError(f"{where} must be a number; received {value!r}") from None


def _value(key: str, value: Any, where: str) -> Any:
    """A torch group value in the spec's types (floats, lists for pairs, "auto" for eps1 = None)."""
    if isinstance(value, bool) or key in INT_KEYS:
        return value
    if key == "adjust_lr_fn":
        return "original" if value is None else value
    if isinstance(value, (tuple, list)):
        return ["auto" if v is None else _float(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return _float(value, where)


def group_values(name: str, group: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The spec hyper-parameters of one torch param group (refusing options twinstep lacks)."""
    keys = CLASSES[{v[0]: k for k, v in CLASSES.items()}[name]][1]
    where = f"optimizer.param_groups[{index}]"
    if group.get("differentiable"):
        raise UnsupportedError(f"{where} has differentiable = True (backpropagation through the optimizer "
                               f"step), which a training spec cannot express")
    if name == "adamw" and group.get("decoupled_weight_decay") is False:
        raise UnsupportedError(f"{where}: torch.optim.AdamW with decoupled_weight_decay = False is "
                               f"torch.optim.Adam; build Adam instead")
    missing = [k for k in keys if k not in group]
    if missing:
        raise ConfigError(f"{where} lacks {missing[0]!r}; a torch.optim {name} group holds it")
    return {k: _value(k, group[k], f"{where}['{k}']") for k in keys}


def named_pairs(named_parameters: Any) -> list[tuple[str, Any]] | None:
    """(name, tensor) pairs from a module, a mapping or an iterable of pairs (read once)."""
    if named_parameters is None:
        return None
    if hasattr(named_parameters, "named_parameters"):
        named_parameters = named_parameters.named_parameters()
    pairs = named_parameters.items() if isinstance(named_parameters, Mapping) else named_parameters
    return [(str(n), p) for n, p in pairs]


def parameter_names(optimizer: Any, pairs: list[tuple[str, Any]] | None) -> dict[int, str]:
    """id(tensor) -> name, from the named parameters, else from the groups' `param_names` (an
    optimizer built from named parameters)."""
    if pairs is None:
        out = {}
        for group in optimizer.param_groups:
            names = group.get("param_names")
            if names is None:
                return {}
            out.update({id(p): n for p, n in zip(group["params"], names)})
        return out
    return {id(p): n for n, p in pairs}


def _members(optimizer: Any, names: dict[int, str]) -> list[list[str]]:
    out = []
    for i, group in enumerate(optimizer.param_groups):
        members = []
        for j, p in enumerate(group["params"]):
            if id(p) not in names:
                raise ConfigError(f"optimizer.param_groups[{i}]['params'][{j}] (shape {tuple(p.shape)}) is not "
                                  f"in named_parameters; pass the model's named_parameters()")
            members.append(names[id(p)])
        out.append(members)
    return out


def _outsiders(pairs: list[tuple[str, Any]] | None, optimizer: Any) -> list[str]:
    """Named parameters the optimizer does not hold; one that requires grad is refused."""
    inside = {id(p) for g in optimizer.param_groups for p in g["params"]}
    out: list[str] = []
    for n, p in pairs or []:
        if id(p) in inside:
            continue
        if getattr(p, "requires_grad", False):
            raise UnsupportedError(f"parameter {n!r} requires grad but is in no param group of the optimizer; "
                                   f"twinstep updates every parameter that has a gradient (freeze it with "
                                   f"requires_grad_(False) or add it to the optimizer)")
        out.append(n)
    return out


def adagrad_initial_values(optimizer: Any) -> list[float | None]:
    """The accumulator value torch actually filled each Adagrad group with (its constructor's value,
    whatever the group says: O-ADAGRAD-GROUP), read from the fresh state; None if stepped."""
    out: list[float | None] = []
    for i, group in enumerate(optimizer.param_groups):
        values = set()
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if "sum" not in state or float(state.get("step", 0)) > 0 or state["sum"].numel() == 0:
                continue
            first = float(state["sum"].reshape(-1)[0])
            if not bool((state["sum"] == first).all()):
                raise UnsupportedError(f"optimizer.param_groups[{i}]: an Adagrad accumulator is not constant "
                                       f"before the first step; twinstep starts it at one value per group")
            values.add(first)
        if len(values) > 1:
            raise UnsupportedError(f"optimizer.param_groups[{i}]: its Adagrad accumulators start at different "
                                   f"values {sorted(values)}; twinstep has one initial_accumulator_value per group")
        out.append(values.pop() if values else float(optimizer.defaults["initial_accumulator_value"]))
    return out


def optimizer_section(optimizer: Any, named_parameters: Any = None,
                      base_lrs: list[float] | None = None) -> dict[str, Any]:
    """The `[optimizer]` section (plain dict) of a torch optimizer. `base_lrs` (one per group, from
    the scheduler) replace the groups' current lr, which a scheduler has already changed."""
    name = optimizer_name(optimizer)
    pairs = named_pairs(named_parameters)
    groups = [group_values(name, g, i) for i, g in enumerate(optimizer.param_groups)]
    if base_lrs is not None:
        for values, lr in zip(groups, base_lrs):
            values["lr"] = float(lr)
    if name == "adagrad":
        for values, init in zip(groups, adagrad_initial_values(optimizer)):
            values["initial_accumulator_value"] = init
    section: dict[str, Any] = {"name": name, **groups[-1]}
    names = parameter_names(optimizer, pairs) if len(groups) > 1 else None
    # groups that differ in nothing but their parameters update each parameter as one group does
    if len(groups) == 1 or (not names and all(values == groups[-1] for values in groups)):
        _outsiders(pairs, optimizer)
        return section
    if not names:
        raise ConfigError(f"the optimizer has {len(groups)} param groups with different settings: pass "
                          f"named_parameters (e.g. model.named_parameters()) so that each group can be written "
                          f"as name patterns")
    members = _members(optimizer, names)
    everyone = [n for m in members for n in m] + _outsiders(pairs, optimizer)
    section["groups"] = [_group_entry(i, members[i], everyone, values, groups[-1])
                         for i, values in enumerate(groups[:-1])]
    return section


def _group_entry(index: int, members: list[str], everyone: list[str], values: dict[str, Any],
                 default: dict[str, Any]) -> dict[str, Any]:
    if not members:
        raise UnsupportedError(f"optimizer.param_groups[{index}] holds no parameter; twinstep's groups select "
                               f"parameters by name (only the last, default group may be empty)")
    changed = {k: v for k, v in values.items() if v != default.get(k)}
    return {"params": cover(members, everyone), **changed}
