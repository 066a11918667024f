"""torch.optim's classes for an [optimizer] spec: one torch param group per twinstep group
(conformance.rules.groups), the spec's fields as the constructor's arguments.

A spec field the class has no argument for (`eps_root`, `eps_hat`, `eps_in_sqrt`, ..., and
`decoupled_weight_decay` on SGD, RMSprop, Adagrad and Adamax, whose torch 2.13 classes lack it) is
dropped at its default (torch's own behaviour) and unsupported at any other value (natives/__init__.py,
rule 2); Adam, NAdam and RAdam take `decoupled_weight_decay` themselves. Lion is not in torch.optim.
Muon updates its 2-D parameters, the fallback class the rest (torch's documented pairing). The
schedule-free optimizers are the `schedulefree` package's AdamWScheduleFree / SGDScheduleFree in
train mode (the parameters are its y). The state is exported under the neutral names of
docs/contract.md §4 (a renaming of torch's keys); `step` is torch's, or the updates a parameter
received where torch keeps none (SGD). An [ema] is torch.optim.swa_utils.AveragedModel with
get_ema_multi_avg_fn(decay), `update_parameters` after each due update.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from conformance.config import OptimizerSpec
from conformance.config.ema import EmaSpec
from conformance.config.optimizer import DEFAULTS
from conformance.rules.groups import ParamGroup, resolve_groups
from conformance.rules.state import check_state
from conformance.rules.trajectory import check_trajectory_inputs
from natives._protocol import ema_due, gradients, refuse, updates
from natives.torch_native.backend import dtype_of, to_numpy

CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad, "adamax": torch.optim.Adamax, "nadam": torch.optim.NAdam,
    "radam": torch.optim.RAdam, "adafactor": torch.optim.Adafactor, "muon": torch.optim.Muon,
}
SCHEDULE_FREE = {"schedule_free_adamw": "AdamWScheduleFree", "schedule_free_sgd": "SGDScheduleFree"}
NEUTRAL = {"exp_avg": "m", "exp_avg_sq": "v", "max_exp_avg_sq": "v_max", "exp_inf": "u"}
TORCH_NAME = {v: k for k, v in NEUTRAL.items()}


def optimizer_class(optimizer: str) -> type[torch.optim.Optimizer]:
    """The torch.optim class (or schedulefree's) of an optimizer name."""
    if optimizer in SCHEDULE_FREE:
        try:
            return getattr(importlib.import_module("schedulefree"), SCHEDULE_FREE[optimizer])
        except ImportError:
            raise refuse(f"optimizer.name = {optimizer!r}", "the schedulefree package is not installed "
                                                            "(pip install schedulefree)") from None
    if optimizer not in CLASSES:
        raise refuse(f"optimizer.name = {optimizer!r}", "torch.optim has no such class")
    return CLASSES[optimizer]


def _label(cls: type) -> str:
    return f"torch.optim.{cls.__name__}" if cls.__module__.startswith("torch.") else f"schedulefree.{cls.__name__}"


def constructor_args(optimizer: str, hp: Mapping[str, Any]) -> dict[str, Any]:
    """A group's hyper-parameters as constructor arguments: a field the class has no argument for is
    dropped at the spec's default and unsupported otherwise (rule 2)."""
    cls = optimizer_class(optimizer)
    accepted = inspect.signature(cls).parameters
    out = {}
    for key, value in hp.items():
        if key not in accepted:
            if value != DEFAULTS[optimizer].get(key, value):
                raise refuse(f"optimizer.{key} = {value!r}", f"{_label(cls)} has no such argument")
            continue
        out[key] = tuple(None if e == "auto" else e for e in value) if key == "eps" and isinstance(value, tuple) \
            else value
    return out


def build(spec: OptimizerSpec, named: Mapping[str, torch.nn.Parameter],
          groups: Sequence[ParamGroup]) -> list[torch.optim.Optimizer]:
    """The torch optimizers of the spec: one class (or Muon plus its fallback class) constructed with
    the spec's hyper-parameters as arguments and one param group per twinstep group, each with its
    own values (torch then honours what it honours per group: Adagrad fills every accumulator with
    the constructor's initial_accumulator_value)."""
    by_class: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        entry = {"params": [named[n] for n in g.names], **constructor_args(g.optimizer, g.hyperparams)}
        by_class.setdefault(g.optimizer, []).append(entry)
    out = []
    for name, entries in by_class.items():
        if name == "muon":
            entries = [e for e in entries if e["params"]]  # torch.optim.Muon refuses an empty group
            if not entries:
                continue
        opt = optimizer_class(name)(entries, **constructor_args(name, spec.base(name)))
        if name in SCHEDULE_FREE:
            opt.train()  # schedulefree's documented training mode: the parameters are y
        out.append(opt)
    return out


def export_state(opts: Sequence[torch.optim.Optimizer], named: Mapping[str, torch.nn.Parameter],
                 counts: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Each updated parameter's torch state under the neutral names."""
    out: dict[str, dict[str, Any]] = {}
    for name, p in named.items():
        st = next((o.state[p] for o in opts if o.state.get(p)), {})
        if not counts[name]:
            continue
        entry: dict[str, Any] = {}
        for key, value in st.items():
            if value is None:
                continue
            if key == "step":
                entry["step"] = int(float(value))
            elif isinstance(value, torch.Tensor):
                entry[NEUTRAL.get(key, key)] = to_numpy(value)
        group = next((g for o in opts for g in o.param_groups if any(p is q for q in g["params"])), {})
        if "weight_sum" in group:  # schedulefree keeps its counters per group (docs/divergences.md SF-COUNT)
            entry.update(step=int(group["k"]), weight_sum=np.asarray(float(group["weight_sum"])),
                         lr_max=np.asarray(float(group["lr_max"])))
        entry.setdefault("step", counts[name])
        out[name] = entry
    return out


def import_state(opts: Sequence[torch.optim.Optimizer], named: Mapping[str, torch.nn.Parameter],
                 state: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Load a neutral start state into torch's per-parameter state; the update counts it implies."""
    counts = {}
    for name, entries in state.items():
        p = named[name]
        opt = next(o for o in opts if any(p is q for g in o.param_groups for q in g["params"]))
        st: dict[str, Any] = {}
        for key, value in entries.items():
            if key == "step":
                if not isinstance(opt, torch.optim.SGD):
                    st["step"] = torch.tensor(float(value), dtype=torch.get_default_dtype())
                counts[name] = int(value)
            else:
                st[TORCH_NAME.get(key, key)] = torch.tensor(np.asarray(value, np.float64), dtype=p.dtype)
        opt.state[p] = st
    return counts


def run_trajectory(spec: OptimizerSpec, params: Mapping[str, np.ndarray], grads: Sequence[Mapping[str, Any]] | None = None,
                   objective: Mapping[str, Any] | None = None, steps: int | None = None, dtype: str = "float64",
                   state: Mapping[str, Mapping[str, Any]] | None = None,
                   ema: EmaSpec | None = None) -> dict[str, list[Any]]:
    """torch.optim stepped over the case's gradients: parameters and neutral state after each update,
    and with [ema] the AveragedModel's weights after each update ({} before its first)."""
    check_trajectory_inputs(spec, params, grads, objective, steps, state)
    dt = dtype_of(dtype)
    named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64), dtype=dt)) for k, v in params.items()}
    shapes = {k: np.shape(v) for k, v in params.items()}
    groups = resolve_groups(spec, shapes)
    opts = build(spec, named, groups)
    counts = dict.fromkeys(named, 0)
    if state:
        check_state(groups, shapes, state)
        counts.update(import_state(opts, named, state))
    if state and any(n in SCHEDULE_FREE for n in (spec.name, *(g.optimizer for g in groups))):
        raise refuse("inputs.state", "a start state is not mapped onto schedulefree's per-group counters")
    average = averaged(ema, named) if ema is not None and ema.enabled else None
    out: dict[str, list[Any]] = {"params": [], "state": [], "ema": []}
    for t in range(updates(grads, steps)):
        current = {k: p.detach().double().numpy() for k, p in named.items()}
        for name, g in gradients(t, list(named), current, grads, objective).items():
            named[name].grad = None if g is None else torch.tensor(g, dtype=dt)
            counts[name] += g is not None
        for opt in opts:
            opt.step()
        out["params"].append({k: to_numpy(p) for k, p in named.items()})
        out["state"].append(export_state(opts, named, counts))
        if average is not None and ema_due(ema, t):  # type: ignore[arg-type]
            average.update_parameters(torch.nn.ParameterList(named.values()))
        out["ema"].append({} if average is None or not int(average.n_averaged) else
                          {k: to_numpy(p) for k, p in zip(named, average.module.parameters())})
    return out


def averaged(ema: EmaSpec, named: Mapping[str, torch.nn.Parameter]) -> torch.optim.swa_utils.AveragedModel:
    """torch's EMA of the weights: AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))
    over a module holding the parameters (the first update_parameters copies them)."""
    if any(p.dtype != torch.float64 for p in named.values()):
        raise refuse(f"ema with {next(iter(named.values())).dtype} weights", "AveragedModel averages in the "
                                                                           "weights' dtype (the spec: float32)")
    swa = torch.optim.swa_utils
    return swa.AveragedModel(torch.nn.ParameterList(named.values()), multi_avg_fn=swa.get_ema_multi_avg_fn(ema.decay))
