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

from conformance.config.optimizer import DEFAULTS, OptimizerSpec
from conformance.errors import ConfigError


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
