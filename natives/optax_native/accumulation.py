"""Gradient accumulation with optax.MultiSteps: each micro-batch's gradient of its mean loss (optax
recipes, natives.optax_native.losses) goes through MultiSteps(identity, every_k_schedule=steps),
which emits the mean of a full window's gradients, accumulated in the case's dtype.

MultiSteps weighs every micro-batch equally (normalize = "tokens" is unsupported) and emits nothing
(a zero update) until a window is full: an incomplete last window's gradient is what it emits. The
window loss is the mean of its micro-batch losses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from conformance.config import AccumulationSpec, LossSpec
from conformance.rules.windows import prepare_windows
from natives._protocol import require, window_slices
from natives.optax_native.backend import dtype_of, to_numpy
from natives.optax_native.losses import arrays, elementwise, reduce, supported


def window_gradients(loss_spec: LossSpec, spec: AccumulationSpec, params: Mapping[str, np.ndarray],
                     micro_batches: Sequence[Mapping[str, Any]], dtype: str = "float64") -> dict[str, Any]:
    """What MultiSteps emits at the end of each window for the linear model x @ w + b."""
    prepare_windows(loss_spec, spec, params, micro_batches)  # host-side input checks (InputError)
    require(spec, "accumulation", "normalize", ("micro_batches",), "optax.MultiSteps (an equal-weight mean)")
    supported(loss_spec)
    dt = dtype_of(dtype)
    p = {k: jnp.asarray(np.asarray(params[k], np.float64), dt) for k in ("w", "b")}

    def loss(q: dict[str, jax.Array], mb: Mapping[str, Any]) -> jax.Array:
        t, w = mb["y"], None if loss_spec.weight is None else jnp.asarray(loss_spec.weight, dt)
        m = mb.get("mask")
        pred = mb["x"] @ q["w"] + q["b"]
        return reduce(loss_spec, *elementwise(loss_spec, pred, t, w), m)[0]

    def batch(mb: Mapping[str, Any]) -> dict[str, jax.Array]:
        out = {"x": jnp.asarray(np.asarray(mb["x"], np.float64), dt), "y": arrays(loss_spec, mb["y"], None, dt)[0]}
        return out if mb.get("mask") is None else {**out, "mask": jnp.asarray(mb["mask"], bool)}

    value_and_grad = jax.jit(jax.value_and_grad(loss))  # one compilation per micro-batch shape
    tx = optax.MultiSteps(optax.identity(), every_k_schedule=spec.steps, accumulator_dtype=dt)
    state, update = tx.init(p), jax.jit(tx.update)  # as a training step runs it: compiled once
    out: dict[str, list[Any]] = {"grads": [], "loss": []}
    for window in window_slices(len(micro_batches), spec.steps, spec.last_window == "drop"):
        values = []
        for j in window:
            value, g = value_and_grad(p, batch(micro_batches[j]))
            emitted, state = update(g, state, p)
            values.append(float(value))
        out["grads"].append({k: to_numpy(v) for k, v in emitted.items()})
        out["loss"].append(float(np.mean(values)))
    return out
