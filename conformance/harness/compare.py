"""Tolerance comparison (docs/contract.md §3): |got - want| <= atol + rtol * |want|, element-wise.

An element whose pass rests on atol alone at a value below it (0 < |want| < atol and
|got − want| > rtol·|want|) says nothing about that value: 0 would pass as well. Each compared array
holding such an element is named in `atol_carried` with its worst relative error there, so that a
report shows it and the harness can refuse a pass that depends on it (docs/contract.md §3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Comparison:
    passed: bool
    max_abs_err: float
    max_rel_err: float
    message: str
    atol_carried: tuple[str, ...] = ()  # "where[i]: relative error r at |want| v", worst element per array


def _as_float(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError("not numeric")
    return arr.astype(np.float64)


def compare(got: Any, want: Any, atol: float, rtol: float) -> Comparison:
    """Compare nested structures (dicts, lists, arrays, numbers, booleans, strings).

    NaN matches NaN and ±inf matches the same infinity; booleans and strings must be equal.
    `message` names the first failing location, e.g. ``params[1].theta[0]: got 2.5, want 2.6``.
    """
    state: dict[str, Any] = {"abs": 0.0, "rel": 0.0, "first": "", "carried": []}
    _walk(got, want, "", atol, rtol, state)
    return Comparison(not state["first"], state["abs"], state["rel"], state["first"], tuple(state["carried"]))


def _fail(state: dict, where: str, text: str) -> None:
    if not state["first"]:
        state["first"] = f"{where or '<value>'}: {text}"


def _walk(got: Any, want: Any, where: str, atol: float, rtol: float, state: dict) -> None:
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return _fail(state, where, f"expected a table, got {type(got).__name__}")
        for key in want:
            sub = f"{where}.{key}" if where else str(key)
            if key not in got:
                _fail(state, sub, "missing from the backend's result")
                continue
            _walk(got[key], want[key], sub, atol, rtol, state)
        return
    if isinstance(want, str):
        if got != want:
            _fail(state, where, f"got {got!r}, want {want!r}")
        return
    if isinstance(want, bool) or (isinstance(want, np.ndarray) and want.dtype == bool):
        if np.shape(got) != np.shape(want) or not np.array_equal(np.asarray(got), np.asarray(want)):
            _fail(state, where, f"got {_brief(got)}, want {_brief(want)}")
        return
    if isinstance(want, Sequence) and not isinstance(want, np.ndarray) and _is_structured(want):
        if not isinstance(got, Sequence) or len(got) != len(want):
            n = len(got) if isinstance(got, Sequence) else type(got).__name__
            return _fail(state, where, f"got {n} entries, want {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            _walk(g, w, f"{where}[{i}]", atol, rtol, state)
        return
    try:
        g, w = _as_float(got), _as_float(want)
    except (TypeError, ValueError):
        return _fail(state, where, f"got {type(got).__name__}, want a number or array")
    if g.shape != w.shape:
        return _fail(state, where, f"shape {g.shape} does not match the expected {w.shape}")
    if w.size == 0:
        return
    same_special = (np.isnan(g) & np.isnan(w)) | (np.isinf(w) & (g == w))
    with np.errstate(invalid="ignore", over="ignore"):  # inf − inf is handled by same_special
        diff = np.where(same_special, 0.0, np.abs(g - w))
    diff = np.where(np.isnan(diff), np.inf, diff)
    bound = atol + rtol * np.abs(np.where(np.isfinite(w), w, 0.0))
    scale = np.abs(w)
    with np.errstate(invalid="ignore"):  # inf / inf (a wrong value against an inf) is set just below
        rel = np.where(diff == 0, 0.0, diff / np.where(scale > 0, scale, np.inf))
    rel = np.where(np.isnan(rel) | ((diff > 0) & (scale == 0)), np.inf, rel)
    state["abs"] = max(state["abs"], float(diff.max()))
    state["rel"] = max(state["rel"], float(rel.max()))
    bad = ~(diff <= bound)
    carried = ~bad & (diff > rtol * scale) & (scale > 0) & (scale < atol)
    if carried.any():
        worst = np.where(carried, rel, -1.0)
        idx = np.unravel_index(int(np.argmax(worst)), w.shape) if w.ndim else ()
        loc = "".join(f"[{i}]" for i in idx)
        state["carried"].append(f"{where or '<value>'}{loc}: relative error {float(rel[idx]):.2g} at "
                                f"|want| {float(scale[idx]):.3g}")
    if bad.any():
        idx = np.unravel_index(int(np.argmax(bad)), w.shape) if w.ndim else ()
        loc = "".join(f"[{i}]" for i in idx)
        _fail(
            state,
            f"{where}{loc}",
            f"got {float(g[idx]):.17g}, want {float(w[idx]):.17g} "
            f"(|diff| {float(diff[idx]):.3g} > atol {atol:g} + rtol {rtol:g}·|want|)",
        )


def _is_structured(seq: Sequence) -> bool:
    """A list of tables or of lists-of-tables (e.g. one parameter set per update), not a numeric array."""
    return any(isinstance(x, (Mapping, str)) or (isinstance(x, Sequence) and _is_structured(x)) for x in seq)


def _brief(x: Any) -> str:
    text = repr(np.asarray(x).tolist())
    return text if len(text) < 80 else text[:77] + "..."
