"""Optimizers with torch.optim's semantics, parameter groups and a neutral state (torch: on
torch.optim; JAX: on optax).

Trainers build the optimizer from the spec and the named parameters (the names of torch's
`named_parameters()`, e.g. `0.weight`), read and set per-group hyper-parameters before every
update (schedules set `lr`; OneCycle cycles `momentum` or `betas[0]`), and move the state between
frameworks through the neutral format of docs/contract.md §4:

    {"step": n, "state": {param_name: {state_name: ndarray}}}

`step` is the number of updates applied (the largest per-parameter count); every parameter that
has been updated has an entry with its own `step` (conformance.rules.state.state_shapes lists the
names). Counting: update t uses the hyper-parameters set for t; bias corrections count the
updates a parameter received. Nothing advances outside `step()` / `update()`: a skipped update
(not calling them, or keeping the old state) leaves everything as it was.

Torch: `state` below is the torch.optim.Optimizer itself. JAX: `state` is the optimizer state (an
`OptimizerState` NamedTuple pytree), and `update(grads, state, params, present=None)` returns
(updates, state) as optax does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import _get_scalar_dtype

from conformance.config.ema import EmaSpec
from conformance.config.optimizer import OptimizerSpec
from conformance.errors import ConfigError, InputError
from conformance.rules.ema import ema_due
from conformance.rules.groups import ParamGroup
from conformance.rules.state import check_state
from conformance.rules.trajectory import check_trajectory_inputs, objective_grads
from ref_torch import _assembly, _schedule_free
from ref_torch.backend import framework_dtype, to_numpy
from ref_torch.ema import export_ema, init_ema, update_ema

__all__ = [
    "build_optimizer", "export_state", "group_hyperparams", "import_state", "run_trajectory",
    "set_group_hyperparams", "to_eval_point", "to_train_point",
]


def build_optimizer(spec: OptimizerSpec, named_params: Any) -> Any:
    """Build the optimizer of `spec` for the named parameters (torch: an iterable of (name,
    parameter), e.g. model.named_parameters(); JAX: the {name: array} parameter dict). Groups come
    from conformance.rules.groups.resolve_groups, in that order. Torch: a torch.optim.Optimizer (the
    built-in class, with foreach/fused kernels on CUDA, or a twinstep class where torch has none)
    whose param_groups carry `param_names`. JAX: an optax GradientTransformationExtraArgs over the
    dict, `update(grads, state, params, present=None)`, where present[name] = False marks a
    parameter without a gradient in this update (not updated, state untouched, as torch does for
    `grad is None`). Zero-size parameters are left out of the optimizer on both sides."""
    return _assembly.make(spec, named_params)


def _public(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k not in ("params", "param_names")}


def group_hyperparams(state: Any) -> list[dict[str, Any]]:
    """The hyper-parameters of every parameter group, in group order (torch vocabulary: lr,
    momentum, betas, ...). Torch: all of param_groups[i] but `params`; JAX: the settable floats."""
    return [_public(g) for g in state.param_groups]


def set_group_hyperparams(state: Any, group: int, **values: Any) -> Any:
    """Set hyper-parameters of parameter group `group` for the next update, e.g. lr=1e-3 or
    betas=(0.85, 0.999). Torch: changes optimizer.param_groups[group] in place and returns the
    optimizer; JAX: returns a new state (jittable, no recompilation). Unknown names raise
    ConfigError."""
    groups = state.param_groups
    if not 0 <= group < len(groups):
        raise ConfigError(f"group {group} does not exist; the optimizer has {len(groups)} groups")
    target = groups[group]
    fixed = ("params", "param_names", "label", "optimizer_name", "use_muon")
    for key, value in values.items():
        if key not in target or key in fixed:
            settable = ", ".join(k for k in _public(target) if k not in fixed)
            raise ConfigError(f"group {group} ({target['label']}, {target['optimizer_name']}) has no settable "
                              f"hyper-parameter {key!r}; settable: {settable}")
        if key == "momentum" and target["optimizer_name"] == "rmsprop" and value > 0:
            _check_rmsprop_buffers(state, group)
        target[key] = tuple(value) if isinstance(value, list) else value
    return state


def _check_rmsprop_buffers(opt: Any, group: int) -> None:
    # torch.optim.RMSprop creates momentum buffers at a parameter's first update only if momentum
    # > 0 then; switching momentum on afterwards would fail inside step() with a KeyError
    for p in opt.param_groups[group]["params"]:
        if opt.state.get(p) and "momentum_buffer" not in opt.state[p]:
            raise ConfigError(f"group {group}: rmsprop parameters updated without momentum keep no momentum "
                              f"buffer (torch.optim.RMSprop); set momentum > 0 before the first update")


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy().copy()


def export_state(state: Any) -> dict[str, Any]:
    """The optimizer state in the neutral format {"step": n, "state": {param: {name: ndarray}}}
    (arrays in their own dtype; `step` entries int64). Parameters never updated have no entry."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for group in state.param_groups:
        names = _assembly.neutral_names(group["optimizer_name"], group)
        for name, p in zip(group["param_names"], group["params"]):
            st = state.state.get(p, {})
            if not st or float(st.get("step", 0)) == 0:
                continue
            entry = {}
            for key, value in st.items():
                if value is None or key not in names:
                    continue
                entry[names[key]] = np.asarray(int(value), np.int64) if key == "step" else _numpy(value)
            out[name] = entry
    return {"step": max((int(e["step"]) for e in out.values()), default=0), "state": out}


def _groups(state: Any) -> list[ParamGroup]:
    out = []
    for g in state.param_groups:
        hp = {k: v for k, v in _public(g).items()}
        if g["optimizer_name"] in ("adam", "adamw"):
            hp.setdefault("amsgrad_variant", "torch")
        out.append(ParamGroup(g["label"], g["optimizer_name"], hp, None, names=tuple(g["param_names"])))
    return out


def _tensor(value: Any, like: torch.Tensor) -> torch.Tensor:
    arr = np.asarray(value)
    if arr.dtype not in (np.float64, np.float32, np.float16):
        arr = arr.astype(np.float32)
    # a copy: the optimizer updates its state in place and must not write into the caller's arrays
    return torch.tensor(arr, device=like.device, dtype=like.dtype)


def import_state(state: Any, neutral: Mapping[str, Any]) -> Any:
    """Load a neutral state ({"step": n, "state": {...}}, as export_state writes) into an
    optimizer of the same spec and parameters. Torch: into the optimizer, in place, returned; JAX:
    a new state built on `state` (its hyper-parameters are kept). Parameters without an entry
    start afresh. Checked first: InputError names the parameter and the state entry."""
    if not isinstance(neutral, Mapping) or not isinstance(neutral.get("state"), Mapping):
        raise InputError("a neutral optimizer state is a table {'step': n, 'state': {param: {name: array}}}")
    entries = neutral["state"]
    shapes = {n: tuple(p.shape) for g in state.param_groups for n, p in zip(g["param_names"], g["params"])}
    check_state(_groups(state), shapes, entries)
    for group in state.param_groups:
        opt = group["optimizer_name"]
        to_torch = {v: k for k, v in _assembly.neutral_names(opt, group).items()}
        for name, p in zip(group["param_names"], group["params"]):
            state.state.pop(p, None)
            if opt == "adagrad":
                state.state[p] = _assembly.fresh_adagrad(p, group)
            if name not in entries:
                continue
            fused, capturable = bool(group.get("fused")), bool(group.get("capturable"))
            new: dict[str, Any] = {}
            for key, value in entries[name].items():
                if key == "step":
                    device = p.device if (fused or capturable) else None
                    new["step"] = torch.tensor(float(np.asarray(value)), dtype=_get_scalar_dtype(is_fused=fused),
                                               device=device)
                elif key in ("mu_product", "weight_sum", "lr_max", "d", "d_max", "d_numerator", "k"):
                    # 0-d: float64 for float64 parameters
                    dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
                    new[key] = torch.tensor(float(np.asarray(value)), dtype=dtype,
                                            device=p.device if capturable else None)
                else:
                    new[to_torch[key]] = _tensor(value, p)
            state.state[p] = new
    return state


def to_eval_point(state: Any, params: Any) -> Any:
    """The parameters to evaluate and save. Schedule-free optimizers: the average
    x = lerp(y, z, 1 − 1/β) (schedulefree's optimizer.eval()); every other optimizer: the parameters
    as they are. Torch: `state` is the optimizer, its parameters move in place (once: it remembers
    being in eval mode) and `params` is returned; JAX: a new {name: array} dict from `params`."""
    if isinstance(state, _schedule_free.ScheduleFree):
        state.eval()
    return params


def to_train_point(state: Any, params: Any) -> Any:
    """The parameters to take gradients at: schedule-free optimizers' y = lerp(x, z, 1 − β)
    (optimizer.train(); after to_eval_point it rounds, as the package's does); every other
    optimizer: the parameters as they are. Torch: in place (once), returns `params`; JAX: a new dict."""
    if isinstance(state, _schedule_free.ScheduleFree):
        state.train()
    return params


def run_trajectory(
    spec: OptimizerSpec,
    params: Mapping[str, np.ndarray],
    grads: list[Mapping[str, np.ndarray]] | None = None,
    objective: Mapping[str, Any] | None = None,
    steps: int | None = None,
    dtype: str = "float64",
    state: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ema: EmaSpec | None = None,
) -> dict[str, Any]:
    """Run `spec` on NumPy parameters: {"params": [after update 0, 1, ...], "state": [neutral
    state after each update], "ema": [the weights' EMA after each update, None before it starts]
    (with `ema`, an [ema] spec)}. Gradients are given per update (a parameter missing from an
    update's table has no gradient there) or come from `objective` (quadratic) for `steps`
    updates; `state` is a neutral state ({param: {name: array}}) to start from."""
    n = check_trajectory_inputs(spec, params, grads, objective, steps, state)
    dt = framework_dtype(dtype)
    named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64), dtype=dt)) for k, v in params.items()}
    opt = build_optimizer(spec, named.items())
    if state:
        import_state(opt, {"state": state})
    if objective is not None:
        target = {part: {k: torch.tensor(np.asarray(v, np.float64), dtype=dt) for k, v in objective[part].items()}
                  for part in ("center", "curvature")}
    out_params, out_state, out_ema = [], [], []
    average = init_ema(ema, named) if ema is not None else None
    for k in range(n):
        if grads is not None:
            for name, p in named.items():
                g = grads[k].get(name)
                p.grad = None if g is None else torch.tensor(np.asarray(g, np.float64), dtype=dt)
        else:
            with torch.no_grad():
                for name, g in objective_grads(target, named).items():
                    named[name].grad = g.detach().clone()
        opt.step()
        out_params.append({name: to_numpy(p).copy() for name, p in named.items()})  # numpy shares memory
        out_state.append({name: {key: np.asarray(a, np.float64) for key, a in e.items()}
                          for name, e in export_state(opt)["state"].items()})
        if average is not None:
            average = update_ema(ema, average, named, ema_due(ema, k))  # type: ignore[arg-type]
            out_ema.append(export_ema(average))
    return {"params": out_params, "state": out_state, "ema": out_ema}
