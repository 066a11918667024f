"""Keras's losses for a [loss] spec (from_logits=True, reduction "sum_over_batch_size" / "sum" /
None), gradients by jax.grad through them.

mse → MeanSquaredError, l1 → MeanAbsoluteError, huber → Huber, bce_with_logits →
BinaryCrossentropy: each averages the last axis per sample first (their "sum" is a sum of
per-sample means, their None a value per sample). cross_entropy with class indices →
SparseCategoricalCrossentropy(ignore_class) with class weights as sample weights and reduction
"mean_with_sample_weight" (what fit(class_weight=...) does); with probabilities →
CategoricalCrossentropy(label_smoothing); torch's class dim 1 of (N, C, d…) moved last, Keras's
class axis. kl_div → KLDivergence on probabilities (exp of
the log inputs), which clips them to [1e-7, 1] and sums the class axis. sigmoid_focal →
BinaryFocalCrossentropy(apply_class_balancing = alpha ≠ -1, alpha, gamma). A mask and
`sample_weight` are Keras's sample weights of the per-sample losses. Keras has no nll, smooth_l1 or
pos_weight; sparse labels take no label smoothing and binary cross-entropy no per-element weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.config import LossSpec
from conformance.rules.inputs import check_loss_inputs
from natives._protocol import refuse, require
from natives.keras_backend.backend import dtype_of, load, to_numpy

REDUCTIONS = {"mean": "sum_over_batch_size", "batchmean": "sum_over_batch_size", "sum": "sum", "none": None}


def loss_object(spec: LossSpec, index: bool, dtype: str, class_weights: bool = False) -> tuple[Any, str | None]:
    """The Keras loss object of the spec and the Keras reduction it uses."""
    keras = load()
    L = keras.losses
    red = REDUCTIONS[spec.reduction]
    if spec.name in ("nll", "smooth_l1"):
        raise refuse(f"loss.name = {spec.name!r}", "keras.losses has no such loss")
    require(spec, "loss", "z_loss", (0.0,), "keras.losses.(Sparse)CategoricalCrossentropy")
    if spec.name == "mse":
        return L.MeanSquaredError(reduction=red, dtype=dtype), red
    if spec.name == "l1":
        return L.MeanAbsoluteError(reduction=red, dtype=dtype), red
    if spec.name == "huber":
        return L.Huber(delta=spec.delta, reduction=red, dtype=dtype), red
    if spec.name == "bce_with_logits":
        if spec.weight is not None or spec.pos_weight is not None:
            raise refuse("loss.weight / pos_weight for bce_with_logits", "keras BinaryCrossentropy weighs samples only")
        return L.BinaryCrossentropy(from_logits=True, reduction=red, dtype=dtype), red
    if spec.name == "kl_div":
        return L.KLDivergence(reduction=red, dtype=dtype), red
    if spec.name == "sigmoid_focal":
        if spec.weight is not None:
            raise refuse("loss.weight for sigmoid_focal", "keras BinaryFocalCrossentropy weighs samples only")
        return L.BinaryFocalCrossentropy(apply_class_balancing=spec.alpha != -1, alpha=max(spec.alpha, 0.0),
                                         gamma=spec.gamma, from_logits=True, reduction=red, dtype=dtype), red
    if index:
        if spec.label_smoothing:
            raise refuse("loss.label_smoothing with class indices", "keras SparseCategoricalCrossentropy has none")
        red = "mean_with_sample_weight" if spec.reduction == "mean" and class_weights else red
        return L.SparseCategoricalCrossentropy(from_logits=True, ignore_class=spec.ignore_index, axis=-1,
                                               reduction=red, dtype=dtype), red
    if spec.weight is not None:
        raise refuse("loss.weight with probability targets", "keras CategoricalCrossentropy weighs samples only")
    return L.CategoricalCrossentropy(from_logits=True, label_smoothing=spec.label_smoothing, axis=-1,
                                     reduction=red, dtype=dtype), red


def loss_value_and_grad(spec: LossSpec, prediction: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None,
                        mask: np.ndarray | None = None, sample_weight: np.ndarray | None = None,
                        dtype: str = "float64") -> dict[str, Any]:
    """The Keras loss, its jax.grad gradient, and (sum, count) from Keras's "sum" reduction."""
    import jax
    import jax.numpy as jnp

    check_loss_inputs(spec, prediction, target, weight, mask, sample_weight)
    dt = dtype_of(dtype)
    index = spec.name == "cross_entropy" and np.issubdtype(np.asarray(target).dtype, np.integer)
    if prediction.ndim == 1 and index:
        raise refuse("an unbatched (C,) prediction", "keras losses take a batch")
    w = weight if weight is not None else (None if spec.weight is None else np.asarray(spec.weight))
    obj, red = loss_object(spec, index, dt, class_weights=w is not None)
    if w is not None and spec.name != "cross_entropy":
        raise refuse("loss.weight", "keras losses weigh samples only")
    y = jnp.asarray(target, jnp.int32) if index else jnp.asarray(np.asarray(target, np.float64), dt)
    sample = None
    if index and w is not None:
        sample = jnp.asarray(np.asarray(w, np.float64)[np.where(target == spec.ignore_index, 0, target)], dt)
    per_sample = np.shape(target) if index else np.shape(prediction)[:-1]
    for what, extra in (("a mask", mask), ("a sample_weight", sample_weight)):
        if extra is None:
            continue
        if np.shape(extra) != per_sample:
            raise refuse(f"{what} of shape {np.shape(extra)}", f"Keras's sample weights weigh the per-sample losses "
                                                               f"{per_sample}")
        m = jnp.asarray(np.asarray(extra, np.float64), dt)
        sample = m if sample is None else sample * m

    last = spec.name == "cross_entropy" and prediction.ndim > 2  # Keras's classes are last: move torch's dim 1

    def f(x: Any, keras_loss: Any) -> Any:
        truth = jnp.exp(y) if spec.name == "kl_div" and spec.log_target else y
        truth = jnp.moveaxis(truth, 1, -1) if last and not index else truth
        return keras_loss(truth, jnp.exp(x) if spec.name == "kl_div" else jnp.moveaxis(x, 1, -1) if last else x,
                          sample_weight=sample)

    x = jnp.asarray(np.asarray(prediction, np.float64), dt)
    grad, value = jax.jit(jax.grad(lambda a: (jnp.sum(f(a, obj)), f(a, obj)), has_aux=True))(x)
    total = float(f(x, obj.__class__.from_config({**obj.get_config(), "reduction": "sum"})))
    mean = float(np.sum(np.asarray(value)))
    return {"value": to_numpy(value), "grad": to_numpy(grad), "sum": total,
            "count": total / mean if mean and red != "sum" else float("nan")}
