"""Host-side input validation, shared by both backends and run before either framework sees data.

torch raises on some bad inputs and silently broadcasts others; optax returns NaN for out-of-range
labels and wraps negative ones (reference/reliability.md §4.5). Both backends call these checks
on NumPy arrays first, so they raise the same `InputError` with the same message.
"""

from __future__ import annotations

import numpy as np

from conformance.config.loss import LossSpec
from conformance.errors import InputError

INDEX_LOSSES = ("cross_entropy", "nll")
ELEMENTWISE_LOSSES = ("mse", "l1", "huber", "smooth_l1", "kl_div", "bce_with_logits")


def _first_bad(mask: np.ndarray) -> str:
    idx = np.argwhere(mask)[0]
    return "(" + ", ".join(str(int(i)) for i in idx) + ")" if mask.ndim else "()"


def check_finite(name: str, x: np.ndarray) -> None:
    """Raise InputError naming the first NaN/Inf element of a floating array."""
    if np.issubdtype(x.dtype, np.floating) or str(x.dtype) == "bfloat16":
        bad = ~np.isfinite(x.astype(np.float64))
        if bad.any():
            value = x.astype(np.float64)[tuple(np.argwhere(bad)[0])] if x.ndim else float(x)
            raise InputError(f"{name} contains a non-finite value ({value}) at index {_first_bad(bad)}")


def is_index_target(spec: LossSpec, prediction: np.ndarray, target: np.ndarray) -> bool:
    """True when the target holds class indices (cross_entropy also accepts probabilities)."""
    if spec.name == "nll":
        return True
    return spec.name == "cross_entropy" and target.shape != prediction.shape


def class_dim(prediction: np.ndarray) -> int:
    """torch's class dimension: 0 for an unbatched (C,) input, else 1."""
    return 0 if prediction.ndim == 1 else 1


def element_shape(spec: LossSpec, prediction: np.ndarray, target: np.ndarray) -> tuple[int, ...]:
    """Shape of the per-element loss (what `reduction = "none"` returns and a mask must match)."""
    if spec.name in INDEX_LOSSES:
        shape = list(prediction.shape)
        del shape[class_dim(prediction)]
        return tuple(shape)
    return tuple(prediction.shape)


def check_loss_inputs(
    spec: LossSpec,
    prediction: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> None:
    """Validate a loss call on the host. Raises InputError with a one-line reason."""
    name = spec.name
    if not (np.issubdtype(prediction.dtype, np.floating) or str(prediction.dtype) == "bfloat16"):
        raise InputError(f"{name} prediction must be floating point; received {prediction.dtype}")
    if prediction.size == 0:
        raise InputError(f"{name} prediction is empty (shape {prediction.shape}); a batch needs elements")
    check_finite("prediction", prediction)
    target_is_int = np.issubdtype(target.dtype, np.integer)
    if name in INDEX_LOSSES:
        _check_class_target(spec, prediction, target, target_is_int)
    else:
        if target_is_int or target.dtype == bool:
            raise InputError(
                f"{name} target must be floating point; received {target.dtype} (cast labels to float)"
            )
        if target.shape != prediction.shape:
            raise InputError(
                f"{name} target shape {target.shape} must equal prediction shape {prediction.shape} "
                f"(torch would broadcast them silently)"
            )
        check_finite("target", target)
        if name == "bce_with_logits" and ((target < 0) | (target > 1)).any():
            raise InputError(f"bce_with_logits target must be in [0, 1]; found {target.min()}..{target.max()}")
        if name == "kl_div" and not spec.log_target and (target < 0).any():
            raise InputError("kl_div target must be probabilities (>= 0) when log_target = false")
    _check_weights(spec, prediction, target, weight)
    shape = element_shape(spec, prediction, target)
    if mask is not None:
        if mask.dtype != bool:
            raise InputError(f"mask must be boolean; received {mask.dtype}")
        if mask.shape != shape:
            raise InputError(f"mask shape {mask.shape} must equal the per-element loss shape {shape}")
        if spec.reduction == "batchmean":
            raise InputError("mask is not supported with reduction = 'batchmean' (it divides by the batch size)")
    if spec.reduction == "mean" and valid_count(spec, prediction, target, weight, mask) == 0:
        raise InputError(
            f"{name} mean over zero elements is undefined: every element is masked or ignored "
            f"(ignore_index = {spec.ignore_index}) or has weight 0"
        )


def _check_class_target(spec: LossSpec, prediction: np.ndarray, target: np.ndarray, is_int: bool) -> None:
    name, cdim = spec.name, class_dim(prediction)
    n_classes = prediction.shape[cdim]
    expected = element_shape(spec, prediction, target)
    if target.shape == prediction.shape and name == "cross_entropy" and not is_int:
        check_finite("target", target)
        if (target < 0).any():
            raise InputError("cross_entropy probability targets must be >= 0")
        return  # class probabilities
    if target.shape == prediction.shape and is_int:
        raise InputError(
            f"{name} target of shape {target.shape} looks one-hot; pass class indices of shape "
            f"{expected} (or float probabilities for cross_entropy)"
        )
    if not is_int:
        kind = "class indices of" if name == "nll" else "class indices (integers) of"
        raise InputError(f"{name} target must be {kind} shape {expected}; received {target.dtype} {target.shape}")
    if target.shape != expected:
        raise InputError(
            f"{name} target shape {target.shape} must be {expected} for prediction shape {prediction.shape} "
            f"(classes on dim {cdim})"
        )
    bad = (target != spec.ignore_index) & ((target < 0) | (target >= n_classes))
    if bad.any():
        value = int(target[tuple(np.argwhere(bad)[0])]) if target.ndim else int(target)
        raise InputError(
            f"{name} target {value} at index {_first_bad(bad)} is out of range for {n_classes} classes "
            f"(valid: 0..{n_classes - 1}, or ignore_index = {spec.ignore_index})"
        )


def _check_weights(spec: LossSpec, prediction: np.ndarray, target: np.ndarray, weight: np.ndarray | None) -> None:
    if weight is None:
        weight = None if spec.weight is None else np.asarray(spec.weight, np.float64)
    if weight is not None:
        check_finite("weight", weight)
        if (weight < 0).any():
            raise InputError("weight must be >= 0")
        if spec.name in INDEX_LOSSES:
            n_classes = prediction.shape[class_dim(prediction)]
            if weight.shape != (n_classes,):
                raise InputError(f"{spec.name} weight must have shape ({n_classes},) (one per class); received {weight.shape}")
        else:
            try:
                full = np.broadcast_shapes(weight.shape, prediction.shape)
            except ValueError:
                full = None
            if full != prediction.shape:
                raise InputError(f"{spec.name} weight shape {weight.shape} does not broadcast to {prediction.shape}")
    if spec.pos_weight is not None:
        if len(spec.pos_weight) != prediction.shape[-1]:
            raise InputError(
                f"bce_with_logits pos_weight has {len(spec.pos_weight)} entries; the prediction's last "
                f"dimension has {prediction.shape[-1]}"
            )


def valid_count(
    spec: LossSpec,
    prediction: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> float:
    """The (weighted) count a mean divides by: mean = sum / count (see oracle.losses)."""
    shape = element_shape(spec, prediction, target)
    valid = np.ones(shape, bool) if mask is None else mask.astype(bool)
    if is_index_target(spec, prediction, target):
        valid = valid & (target != spec.ignore_index)
        w = weight if weight is not None else (None if spec.weight is None else np.asarray(spec.weight))
        if w is not None:
            safe = np.where(valid, target, 0)
            return float(np.sum(np.where(valid, np.asarray(w, np.float64)[safe], 0.0)))
    if spec.reduction == "batchmean":
        return float(prediction.shape[0]) if prediction.ndim >= 1 else 1.0
    return float(valid.sum())
