"""Host-side input validation, shared by both backends and run before either framework sees data.

torch raises on some bad inputs and silently broadcasts others; optax returns NaN for out-of-range
labels and wraps negative ones (reference/reliability.md §4.5). Both backends call these checks
on NumPy arrays first, so they raise the same `InputError` with the same message.

What is accepted as torch accepts it: `-inf` logits (probability 0, the masking idiom) for the
losses in NEG_INF_LOSSES, with torch's values (+inf where the target's own class is -inf, NaN
where torch computes 0·(-inf)); `+inf` logits (probability 1) in bce_with_logits (POS_INF_LOSSES),
+inf for targets below 1 and NaN at 1 (0·inf), as torch; `pos_weight` broadcast against the prediction as torch broadcasts
it; masks of booleans or of numbers that are exactly 0 or 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from conformance.config.loss import LossSpec
from conformance.errors import InputError

INDEX_LOSSES = ("cross_entropy", "nll")
ELEMENTWISE_LOSSES = ("mse", "l1", "huber", "smooth_l1", "kl_div", "bce_with_logits", "sigmoid_focal")
BINARY_LOSSES = ("bce_with_logits", "sigmoid_focal")  # logits against targets in [0, 1]
# -inf logits mean probability 0; torch's gradients stay finite there. sigmoid_focal is left out:
# torchvision's formula multiplies bce's NaN by the focal factor, so even a masked -inf has a NaN gradient.
NEG_INF_LOSSES = ("cross_entropy", "nll", "bce_with_logits")
# +inf logits mean probability 1: torch's bce_with_logits is +inf for y < 1, NaN for y = 1 (0·inf),
# with the finite gradient 1 − y. Elsewhere torch's results at +inf are NaN or meaningless.
POS_INF_LOSSES = ("bce_with_logits",)


def _first_bad(mask: np.ndarray) -> str:
    idx = np.argwhere(mask)[0]
    return "(" + ", ".join(str(int(i)) for i in idx) + ")" if mask.ndim else "()"


def _is_float(x: np.ndarray) -> bool:
    return np.issubdtype(x.dtype, np.floating) or str(x.dtype) == "bfloat16"


def first_nonfinite(tensors: Mapping[str, Any]) -> str | None:
    """The name of the first tensor holding a NaN or an inf ({name: array}, nested tables named
    `table/name`), or None when every floating-point value is finite."""
    for name, value in tensors.items():
        if isinstance(value, Mapping):
            inner = first_nonfinite(value)
            if inner is not None:
                return f"{name}/{inner}"
            continue
        arr = np.asarray(value)
        if _is_float(arr) and not np.all(np.isfinite(arr.astype(np.float64))):
            return name
    return None

def check_finite(name: str, x: np.ndarray, allow_neg_inf: bool = False, allow_pos_inf: bool = False) -> None:
    """Raise InputError naming the first NaN/Inf element of a floating array (-inf, +inf allowed on request)."""
    if _is_float(x):
        v = x.astype(np.float64)
        bad = np.isnan(v) | ((v == np.inf) & (not allow_pos_inf)) | ((v == -np.inf) & (not allow_neg_inf))
        if bad.any():
            value = v[tuple(np.argwhere(bad)[0])] if x.ndim else float(v)
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


def bool_mask(mask: np.ndarray | None) -> np.ndarray | None:
    """A checked mask (booleans or 0/1 numbers, see check_mask) as booleans."""
    return None if mask is None else np.asarray(mask) != 0


def check_mask(mask: np.ndarray, shape: tuple[int, ...], name: str = "mask") -> None:
    """A mask holds booleans, or numbers that are exactly 0 or 1, in the per-element loss shape."""
    m = np.asarray(mask)
    if m.dtype != bool:
        if not (m.dtype.kind in "iuf" or str(m.dtype) == "bfloat16"):
            raise InputError(f"{name} must hold booleans or the numbers 0 and 1; received {m.dtype}")
        v = m.astype(np.float64)
        bad = ~((v == 0) | (v == 1))  # NaN is neither
        if bad.any():
            value = v[tuple(np.argwhere(bad)[0])] if m.ndim else float(v)
            raise InputError(f"{name} must hold only 0 or 1 (or booleans); found {value} at index {_first_bad(bad)}")
    if m.shape != shape:
        raise InputError(f"{name} shape {m.shape} must equal the per-element loss shape {shape}")


def check_sample_weight(sample_weight: np.ndarray, shape: tuple[int, ...]) -> None:
    """Per-sample weights: numbers >= 0 whose shape is the leading dimensions of the per-element
    loss shape (one per sample: (N,); per token: (N, T); or the whole shape), broadcast over the rest."""
    sw = np.asarray(sample_weight)
    if not (sw.dtype.kind in "iuf" or str(sw.dtype) == "bfloat16"):
        raise InputError(f"sample_weight must hold numbers; received {sw.dtype}")
    check_finite("sample_weight", sw)
    v = sw.astype(np.float64)
    if (v < 0).any():
        value = v[tuple(np.argwhere(v < 0)[0])] if v.ndim else float(v)
        raise InputError(f"sample_weight must be >= 0; found {value} at index {_first_bad(v < 0)}")
    if sw.ndim > len(shape) or sw.shape != shape[:sw.ndim]:
        hint = f" (one per sample: ({shape[0]},))" if shape else ""
        raise InputError(f"sample_weight shape {sw.shape} must be the leading dimensions of the per-element "
                         f"loss shape {shape}{hint}")


def check_loss_inputs(
    spec: LossSpec,
    prediction: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    sample_weight: np.ndarray | None = None,
) -> None:
    """Validate a loss call on the host. Raises InputError with a one-line reason."""
    name = spec.name
    if not _is_float(prediction):
        raise InputError(f"{name} prediction must be floating point; received {prediction.dtype}")
    if prediction.size == 0:
        raise InputError(f"{name} prediction is empty (shape {prediction.shape}); a batch needs elements")
    _check_prediction_values(spec, prediction)
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
        if name in BINARY_LOSSES and ((target < 0) | (target > 1)).any():
            raise InputError(f"{name} target must be in [0, 1]; found {target.min()}..{target.max()}")
        if name == "kl_div" and not spec.log_target and (target < 0).any():
            raise InputError("kl_div target must be probabilities (>= 0) when log_target = false")
    _check_weights(spec, prediction, target, weight)
    shape = element_shape(spec, prediction, target)
    if mask is not None:
        check_mask(mask, shape)
        if spec.reduction == "batchmean":
            raise InputError("mask is not supported with reduction = 'batchmean' (it divides by the batch size)")
    if sample_weight is not None:
        check_sample_weight(sample_weight, shape)
    if spec.reduction == "mean" and valid_count(spec, prediction, target, weight, mask) == 0:
        raise InputError(
            f"{name} mean over zero elements is undefined: every element is masked or ignored "
            f"(ignore_index = {spec.ignore_index}) or has weight 0"
        )


def _check_prediction_values(spec: LossSpec, prediction: np.ndarray) -> None:
    check_finite("prediction", prediction, allow_neg_inf=True, allow_pos_inf=spec.name in POS_INF_LOSSES)
    v = prediction.astype(np.float64)
    if spec.name not in NEG_INF_LOSSES and np.isneginf(v).any():
        raise InputError(f"prediction contains a non-finite value (-inf) at index {_first_bad(np.isneginf(v))}; "
                         f"-inf logits (probability 0) are accepted by {', '.join(NEG_INF_LOSSES)} only")
    if spec.name == "cross_entropy" and prediction.ndim >= 1:
        cdim = class_dim(prediction)
        dead = np.all(np.isneginf(v), axis=cdim)
        if dead.any():
            idx = [str(int(i)) for i in np.argwhere(dead)[0]] if dead.ndim else []
            idx.insert(cdim, ":")
            raise InputError(f"cross_entropy prediction is -inf for every class at index ({', '.join(idx)}) "
                             "(no class has probability > 0; torch returns NaN)")


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
        elif not _broadcasts_to(weight.shape, prediction.shape):
            raise InputError(f"{spec.name} weight shape {weight.shape} does not broadcast to {prediction.shape}")
    if spec.pos_weight is not None:
        pw = np.asarray(spec.pos_weight, np.float64)
        if not _broadcasts_to(pw.shape, prediction.shape):
            hint = ("a 0-d prediction takes a number, pos_weight = 2.5" if prediction.ndim == 0 else
                    f"torch broadcasts it against the prediction: e.g. 1 value, or {prediction.shape[-1]} "
                    "for the last dimension")
            raise InputError(f"bce_with_logits pos_weight shape {pw.shape} does not broadcast to the prediction "
                             f"shape {prediction.shape} ({hint})")


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    # torch's in-place multiply: broadcasting may not grow the prediction's shape
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def valid_count(
    spec: LossSpec,
    prediction: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> float:
    """The (weighted) count a mean divides by: mean = sum / count (see oracle.losses). Sample
    weights multiply the per-sample loss and leave the count alone."""
    shape = element_shape(spec, prediction, target)
    valid = np.ones(shape, bool) if mask is None else bool_mask(mask)
    if is_index_target(spec, prediction, target):
        valid = valid & (target != spec.ignore_index)
        w = weight if weight is not None else (None if spec.weight is None else np.asarray(spec.weight))
        if w is not None:
            safe = np.where(valid, target, 0)
            return float(np.sum(np.where(valid, np.asarray(w, np.float64)[safe], 0.0)))
    if spec.reduction == "batchmean":
        return float(prediction.shape[0]) if prediction.ndim >= 1 else 1.0
    return float(np.sum(valid))
