"""Parameter groups: which parameter each optimizer hyper-parameter applies to (framework-neutral).

Both backends build their parameter groups from `resolve_groups(spec, shapes)`, so torch's
`optimizer.param_groups[i]` and JAX's group i hold the same parameters and hyper-parameters, in
the same order, on every backend (also the order of every per-group list: metrics' `lr`, cases,
checkpoints).

The layout depends on the spec alone (`group_layout`): one group per `[[optimizer.groups]]` entry
in file order, then the default group (parameters no pattern matches), always last and kept even
when empty. Two options split each of them into parts, in this order:

- muon: the Muon part (2-D parameters not matched by `fallback_params`), then the fallback part
  (every other parameter), updated by `[optimizer.fallback]`;
- `no_weight_decay` patterns: the decayed part, then a part with weight_decay = 0.

Labels read `groups[0]`, `groups[0].no_decay`, `default`, `default.fallback`, ... A group's
overrides apply to every part whose optimizer reads the field (an `lr` override applies to both
Muon and fallback parts). Patterns are shell globs over the full parameter name
(`fnmatch.fnmatchcase`: `*` also matches dots, so `*.bias` matches `h.0.attn.bias`). A pattern
that matches no parameter, or a parameter matched by two groups, is a ConfigError naming them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.errors import ConfigError, InputError
from conformance.spec.optimizer import DEFAULTS, OptimizerSpec


@dataclass(frozen=True)
class ParamGroup:
    """One parameter group: its label, the optimizer that updates it and every hyper-parameter of
    that optimizer (torch vocabulary, resolved), plus the parameter names it holds."""

    label: str
    optimizer: str
    hyperparams: Mapping[str, Any]
    source: int | None  # index into spec.groups; None for the default group
    decay: bool = True
    fallback: bool = False
    names: tuple[str, ...] = field(default=())


def group_layout(spec: OptimizerSpec) -> list[ParamGroup]:
    """The parameter groups a spec defines, without parameters (see the module docstring)."""
    sources: list[int | None] = [*range(len(spec.groups)), None]
    kinds = [False, True] if spec.name == "muon" else [False]
    decays = [True, False] if spec.no_weight_decay is not None else [True]
    out: list[ParamGroup] = []
    for source in sources:
        overrides = spec.groups[source].overrides() if source is not None else {}
        for fallback in kinds:
            name = spec.fallback.name if fallback and spec.fallback is not None else spec.name
            base = spec.base(name)
            hp = {**base, **{k: v for k, v in overrides.items() if k in DEFAULTS[name]}}
            for decay in decays:
                label = "default" if source is None else f"groups[{source}]"
                label += ".fallback" if fallback else ""
                label += "" if decay else ".no_decay"
                values = dict(hp) if decay else {**hp, "weight_decay": 0.0}
                out.append(ParamGroup(label, name, values, source, decay, fallback))
    return out


def group_base_lrs(spec: OptimizerSpec) -> list[float]:
    """The lr of every parameter group, in group order (what a schedule starts each group from)."""
    return [float(g.hyperparams["lr"]) for g in group_layout(spec)]


def _matches(patterns: Sequence[str], names: Iterable[str], where: str) -> set[str]:
    names = list(names)
    found: set[str] = set()
    for i, pattern in enumerate(patterns):
        hit = {n for n in names if fnmatch.fnmatchcase(n, pattern)}
        if not hit:
            shown = ", ".join(repr(n) for n in names[:6]) + (", ..." if len(names) > 6 else "")
            raise ConfigError(f"{where}[{i}] = {pattern!r} matches no parameter (parameters: {shown or 'none'})")
        found |= hit
    return found


def assign_groups(spec: OptimizerSpec, names: Sequence[str]) -> list[int | None]:
    """For each parameter name, the index of the `[[optimizer.groups]]` entry it belongs to (None:
    the default group). Raises ConfigError for unmatched patterns and doubly matched parameters."""
    owner: dict[str, int] = {}
    for i, group in enumerate(spec.groups):
        for name in sorted(_matches(group.params, names, f"optimizer.groups[{i}].params")):
            if name in owner:
                j = owner[name]
                raise ConfigError(
                    f"parameter {name!r} is matched by optimizer.groups[{j}] ({_which(spec, j, name)}) and "
                    f"optimizer.groups[{i}] ({_which(spec, i, name)}); a parameter belongs to one group only"
                )
            owner[name] = i
    return [owner.get(n) for n in names]


def _which(spec: OptimizerSpec, i: int, name: str) -> str:
    return ", ".join(repr(p) for p in spec.groups[i].params if fnmatch.fnmatchcase(name, p))


def resolve_groups(spec: OptimizerSpec, shapes: Mapping[str, Sequence[int]]) -> list[ParamGroup]:
    """`group_layout(spec)` with each group's parameter names filled in, in the order of `shapes`
    (the model's `named_parameters()` order)."""
    names = list(shapes)
    if len(set(names)) != len(names):
        raise ConfigError("parameter names must be unique")
    owners = assign_groups(spec, names)
    no_decay = _matches(spec.no_weight_decay, names, "optimizer.no_weight_decay") if spec.no_weight_decay else set()
    forced = _matches(spec.fallback_params, names, "optimizer.fallback_params") if spec.fallback_params else set()
    members: dict[tuple[int | None, bool, bool], list[str]] = {}
    for name, owner in zip(names, owners):
        fallback = spec.name == "muon" and (len(tuple(shapes[name])) != 2 or name in forced)
        members.setdefault((owner, fallback, name not in no_decay), []).append(name)
    out = []
    for g in group_layout(spec):
        picked = members.get((g.source, g.fallback, g.decay), [])
        out.append(ParamGroup(g.label, g.optimizer, g.hyperparams, g.source, g.decay, g.fallback, tuple(picked)))
    return out


def group_of(groups: Sequence[ParamGroup]) -> dict[str, int]:
    """Parameter name -> index of its group."""
    return {name: i for i, g in enumerate(groups) for name in g.names}


# ----------------------------------------------------------------------------------------------
# Neutral optimizer state names and host-side checks shared by every backend's run_trajectory
# ----------------------------------------------------------------------------------------------


def state_shapes(optimizer: str, hp: Mapping[str, Any], shape: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """The neutral state (CONTRACT.md §4) of a parameter that has been updated at least once:
    state name -> shape. Every state has `step` (the updates this parameter received: torch keeps
    one per parameter; twinstep adds it for sgd and muon). Names beside the contract's: nadam
    `mu_product` (torch's running product of the momentum schedule, 0-d), adafactor `row_var`,
    `col_var` (torch's keepdim shapes) or `variance` (<2-D), adam `v_hat_max` (amsgrad_variant
    "optax": the max of the bias-corrected v)."""
    shape = tuple(int(n) for n in shape)
    out: dict[str, tuple[int, ...]] = {"step": ()}
    full = {"m": shape, "v": shape}
    if optimizer in ("sgd", "muon"):
        if optimizer == "muon" or hp["momentum"] != 0:
            out["momentum_buffer"] = shape
    elif optimizer == "rmsprop":
        out["square_avg"] = shape
        if hp["centered"]:
            out["grad_avg"] = shape
        if hp["momentum"] > 0:
            out["momentum_buffer"] = shape
    elif optimizer == "adagrad":
        out["sum"] = shape
    elif optimizer == "adamax":
        out.update(m=shape, u=shape)
    elif optimizer == "lion":
        out["m"] = shape
    elif optimizer == "adafactor":
        if len(shape) > 1:
            out["row_var"] = shape[:-1] + (1,)
            out["col_var"] = shape[:-2] + (1,) + shape[-1:]
        else:
            out["variance"] = shape
    else:
        out.update(full)
        if optimizer == "nadam":
            out["mu_product"] = ()
        if optimizer in ("adam", "adamw") and hp["amsgrad"]:
            out["v_hat_max" if hp["amsgrad_variant"] == "optax" else "v_max"] = shape
    return out


def check_state(groups: Sequence[ParamGroup], shapes: Mapping[str, Sequence[int]],
                state: Mapping[str, Mapping[str, Any]]) -> None:
    """A neutral per-parameter state must name known parameters and exactly the state names and
    shapes of each parameter's optimizer (InputError otherwise). Parameters may be absent: they
    have not been updated yet."""
    import numpy as np

    owner = group_of(groups)
    for name, entries in state.items():
        if name not in owner:
            raise InputError(f"optimizer state names parameter {name!r}, which the model does not have")
        group = groups[owner[name]]
        want = state_shapes(group.optimizer, group.hyperparams, shapes[name])
        if not isinstance(entries, Mapping) or set(entries) != set(want):
            got = sorted(entries) if isinstance(entries, Mapping) else type(entries).__name__
            raise InputError(f"optimizer state of {name!r} ({group.optimizer}) must hold {sorted(want)}; "
                             f"received {got}")
        for key, shape in want.items():
            arr = np.asarray(entries[key])
            if arr.shape != shape:
                raise InputError(f"optimizer state {name!r}.{key} must have shape {shape}; received {arr.shape}")
            if not np.all(np.isfinite(arr.astype(np.float64))):
                raise InputError(f"optimizer state {name!r}.{key} contains a non-finite value")
        step = float(np.asarray(entries["step"]))
        if step < 0 or step != int(step):
            raise InputError(f"optimizer state {name!r}.step must be a non-negative integer; received {step}")


def _check_array(where: str, x: Any, shape: Sequence[int] | None = None) -> None:
    import numpy as np

    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise InputError(f"{where} must be a numeric array; received {arr.dtype}")
    if shape is not None and arr.shape != tuple(shape):
        raise InputError(f"{where} has shape {arr.shape}; the parameter has shape {tuple(shape)}")
    if not np.all(np.isfinite(arr.astype(np.float64))):
        raise InputError(f"{where} contains a non-finite value")


def check_trajectory_inputs(spec: OptimizerSpec, params: Mapping[str, Any], grads: Any, objective: Any,
                            steps: Any, state: Any) -> int:
    """Validate a run_trajectory call on the host (same InputError / ConfigError on every backend);
    return the number of updates."""
    import numpy as np

    if not isinstance(params, Mapping) or not params:
        raise InputError("params must be a non-empty table of parameter name -> array")
    shapes = {k: np.shape(v) for k, v in params.items()}
    for name, value in params.items():
        _check_array(f"params[{name!r}]", value)
    if (grads is None) == (objective is None):
        raise InputError("give either grads (one table per update) or objective with steps, not both")
    if grads is not None:
        if steps is not None and steps != len(grads):
            raise InputError(f"steps = {steps} does not match the {len(grads)} gradient tables")
        for k, table in enumerate(grads):
            for name, g in table.items():
                if name not in shapes:
                    raise InputError(f"grads[{k}] names parameter {name!r}, which params does not have")
                _check_array(f"grads[{k}][{name!r}]", g, shapes[name])
        n = len(grads)
    else:
        if objective.get("kind", "quadratic") != "quadratic":
            raise InputError(f"objective.kind must be 'quadratic'; received {objective.get('kind')!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise InputError(f"steps must be an integer >= 0 with an objective; received {steps!r}")
        for part in ("center", "curvature"):
            table = objective.get(part)
            if not isinstance(table, Mapping) or set(table) != set(shapes):
                raise InputError(f"objective.{part} must give every parameter ({', '.join(shapes)})")
            for name, x in table.items():
                _check_array(f"objective.{part}[{name!r}]", x)
                if np.broadcast_shapes(np.shape(x), shapes[name]) != shapes[name]:
                    raise InputError(f"objective.{part}[{name!r}] of shape {np.shape(x)} does not broadcast "
                                     f"to the parameter's shape {shapes[name]}")
        n = steps
    groups = resolve_groups(spec, shapes)
    if state:
        check_state(groups, shapes, state)
    return n


def objective_grads(objective: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Gradient of L = Σ curvature/2 · (p − center)² at `params` (any array type with arithmetic)."""
    center, curvature = objective["center"], objective["curvature"]
    return {k: curvature[k] * (p - center[k]) for k, p in params.items()}

