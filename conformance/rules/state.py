"""The neutral optimizer-state layout (docs/contract.md §4): which state names and shapes each optimizer keeps
per parameter, and the check every backend applies to a state handed to it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.errors import InputError
from conformance.rules.groups import ParamGroup, group_of


def state_shapes(optimizer: str, hp: Mapping[str, Any], shape: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """The neutral state (docs/contract.md §4) of a parameter that has been updated at least once:
    state name -> shape. Every state has `step` (the updates this parameter received: torch keeps
    one per parameter; twinstep adds it for sgd and muon). Names beside the contract's: nadam
    `mu_product` (torch's running product of the momentum schedule, 0-d), adafactor `row_var`,
    `col_var` (torch's keepdim shapes) or `variance` (<2-D), adam `v_hat_max` (amsgrad_variant
    "optax": the max of the bias-corrected v), ademamix `m_slow` (the slow EMA, apple/ml-ademamix's
    exp_avg_slow; `m` is its exp_avg_fast). Schedule-free (schedulefree's names): `z` (the base
    sequence), schedule_free_adamw also `v` (the package's exp_avg_sq), and the 0-d `weight_sum`
    (Σ of the averaging weights so far) and `lr_max` (the largest warmed-up lr so far); in training
    the parameter is the gradient point y, and the average x (what to evaluate and save) is
    (y − (1−β)·z)/β, as in the package's AdamWScheduleFree and optax.contrib.schedule_free.
    Prodigy (prodigyopt's names but m, v for exp_avg, exp_avg_sq; no m when β1 = 0): `s` (the gradients' weighted sum)
    and `p0` (the parameter at its first update), and the optimizer's shared 0-d `d`, `d_max`,
    `d_numerator` and `k` (its update count, a float), equal in every entry."""
    shape = tuple(int(n) for n in shape)
    out: dict[str, tuple[int, ...]] = {"step": ()}
    full = {"m": shape, "v": shape}
    if optimizer in ("schedule_free_adamw", "schedule_free_sgd"):
        out.update(z=shape, weight_sum=(), lr_max=())
        if optimizer == "schedule_free_adamw":
            out["v"] = shape
    elif optimizer in ("sgd", "muon"):
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
    elif optimizer == "ademamix":
        out.update(m=shape, m_slow=shape, v=shape)
    elif optimizer == "prodigy":
        out.update(v=shape, s=shape, p0=shape, d=(), d_max=(), d_numerator=(), k=())
        if hp["betas"][0] > 0:  # prodigyopt 1.1.2 keeps no exp_avg at beta1 = 0
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
            value = entries[key]
            lazy = getattr(value, "lazy", False)  # a sharded checkpoint's slice reader checks finiteness on reading
            got = tuple(value.shape) if lazy else np.asarray(value).shape
            if got != shape:
                raise InputError(f"optimizer state {name!r}.{key} must have shape {shape}; received {got}")
            if not lazy and not np.all(np.isfinite(np.asarray(value).astype(np.float64))):
                raise InputError(f"optimizer state {name!r}.{key} contains a non-finite value")
        step = float(np.asarray(entries["step"]))
        if step < 0 or step != int(step):
            raise InputError(f"optimizer state {name!r}.step must be a non-negative integer; received {step}")
