"""keras.optimizers.LossScaleOptimizer's dynamic loss scale, driven as in training: one float32 variable
and SGD, the gradient of the scaled loss (inf for a non-finite update), `stateless_apply` (Keras's
JAX training loop; its stateful `apply` cannot branch eagerly on JAX).

LossScaleOptimizer doubles and halves (growth_factor 2, backoff_factor 0.5 only), takes
`initial_scale` and `dynamic_growth_steps` (= growth_interval), has no limit on consecutive skips
and no raise policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.config import PrecisionSpec
from conformance.rules.loss_scale import require_dynamic_scaling
from natives._protocol import refuse, require
from natives.keras_backend.backend import load


def loss_scale_trace(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict[str, Any]:
    """The scale in force at each update, whether Keras skipped it, and its step counter."""
    require_dynamic_scaling(spec)
    native = "keras LossScaleOptimizer"
    require(spec, "precision", "growth_factor", (2.0,), native + " (it doubles)")
    require(spec, "precision", "backoff_factor", (0.5,), native + " (it halves)")
    require(spec, "precision", "on_nonfinite", ("skip",), native + " (it always skips)")
    run = longest = 0
    for ok in finite:
        run = 0 if ok else run + 1
        longest = max(longest, run)
    if spec.max_consecutive_skips is not None and longest > spec.max_consecutive_skips:
        raise refuse(f"precision.max_consecutive_skips = {spec.max_consecutive_skips} with {longest} skips in a row",
                     native + " has no limit on consecutive skips")
    keras = load()
    p = keras.Variable(np.array([1.0], np.float32), dtype="float32", name="p")
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=spec.init_scale,
                                              dynamic_growth_steps=spec.growth_interval)
    opt.build([p])
    import jax

    step = jax.jit(opt.stateless_apply)  # Keras's JAX training loop jits it
    out: dict[str, list[Any]] = {"scale": [], "skipped": [], "growth_tracker": []}
    for ok in finite:
        scale = float(np.asarray(opt.dynamic_scale.value))
        grad = 2.0 * np.asarray(p.value) * scale if ok else np.array([np.inf], np.float32)  # d(scale·p²)/dp
        before = np.asarray(p.value).copy()
        # on JAX, Keras's optimizers are applied statelessly (its documented JAX training loop)
        new_p, new_state = step([v.value for v in opt.variables], [keras.ops.convert_to_tensor(grad, "float32")],
                                [p.value])
        p.assign(new_p[0])
        for var, value in zip(opt.variables, new_state):
            var.assign(value)
        out["scale"].append(scale)
        out["skipped"].append(bool(np.array_equal(before, np.asarray(p.value))))
        out["growth_tracker"].append(int(np.asarray(opt.step_counter.value)))
    return out
