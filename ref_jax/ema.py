"""The weights' exponential moving average (config `[ema]`, conformance/config/ema.py): kept beside
the weights in float32 (float64 for float64 weights), checkpointed, exportable.

    state = init_ema(spec, params)                        # {name: weight}; None without [ema] decay
    state = update_ema(spec, state, params, due)          # after an update; due = ema_due(spec, t) and applied
    weights = export_ema(state)                           # {name: ndarray}, None before the first update
    state = import_ema(state, weights)                    # from a checkpoint

The first due update copies the weights, later ones compute torch's lerp(ema, p, 1 − decay) (as
torch.optim.swa_utils.get_ema_multi_avg_fn). Torch: `EmaState.weights` are tensors beside the
parameters, updated in place with one foreach kernel; JAX: arrays, `update_ema` is pure and
jittable (`due` may be a traced boolean).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from conformance.checkpoint import check_tensors
from conformance.config.ema import EmaSpec
from conformance.rules.ema import ema_dtype
from ref_jax._kernels import lerp

__all__ = ["EmaState", "export_ema", "import_ema", "init_ema", "update_ema"]


def _dtype(w: Any) -> str:
    return jnp.dtype(w.dtype).name


class EmaState(NamedTuple):
    """The EMA weights by parameter name, and whether the first update has copied the weights."""

    weights: dict[str, Any]
    started: Any


def init_ema(spec: EmaSpec, params: Mapping[str, Any]) -> EmaState | None:
    """A fresh EMA for `params` ({name: tensor or array}); None when `spec` keeps no EMA."""
    if spec.decay is None:
        return None
    weights = {n: jnp.zeros(jnp.shape(p), ema_dtype(jnp.dtype(p.dtype).name)) for n, p in params.items()}
    return EmaState(weights, jnp.asarray(False))


def update_ema(spec: EmaSpec, state: EmaState, params: Mapping[str, Any], due: Any) -> EmaState:
    """The EMA after an update: unchanged unless `due`; the first due update copies the weights,
    later ones lerp(ema, p, 1 − decay). Torch: in place (and returned); JAX: a new state."""
    due = jnp.asarray(due)
    weight = 1.0 - float(spec.decay)  # type: ignore[arg-type]
    new = {}
    for name, e in state.weights.items():
        p = params[name].astype(e.dtype)
        moved = jnp.where(state.started, lerp(e, p, weight), p)
        new[name] = jnp.where(due, moved, e)
    return EmaState(new, state.started | due)


def export_ema(state: EmaState | None) -> dict[str, np.ndarray] | None:
    """The EMA weights as NumPy arrays by name (None before the first update or without an EMA)."""
    if state is None or not bool(state.started):
        return None
    return {n: np.array(jax.device_get(w)) for n, w in state.weights.items()}


def import_ema(state: EmaState, weights: Mapping[str, np.ndarray] | None) -> EmaState:
    """`state` with the EMA weights of a checkpoint (None: not started). Torch: copied in place.
    Names, shapes and dtypes must match the EMA's (CheckpointError naming the tensor, e.g. 'ema/w')."""
    if weights is not None:
        check_tensors({n: (tuple(w.shape), _dtype(w)) for n, w in state.weights.items()}, dict(weights), "ema/")
    if weights is None:
        return EmaState(state.weights, jnp.asarray(False))
    new = {n: jnp.asarray(np.asarray(weights[n])).astype(w.dtype) for n, w in state.weights.items()}
    return EmaState(new, jnp.asarray(True))
