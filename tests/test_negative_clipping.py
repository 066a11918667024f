"""Negative controls for clipping: deliberately wrong clippers that the bundled clip cases must catch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conformance.config.clip import ClipSpec
from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case
from conformance.oracle import clipping as oracle

CASES = {c.id: c for c in load_cases(only=["clip/*"])}


def mutant(name: str, fn: Callable[..., Any]) -> PatchedBackend:
    """The oracle with clipping.clip_and_norm replaced by a wrong variant."""
    return PatchedBackend("oracle", patches=(("clipping", "clip_and_norm", fn),), label=name)


def no_eps(spec: ClipSpec, grads: dict, dtype: str = "float64") -> dict:
    """Optax's rule whatever eps says (the torch -> JAX porting bug of goodfire-ai/spd#643)."""
    return oracle.clip_and_norm(spec.model_copy(update={"eps": 0.0}) if spec.max_norm else spec, grads, dtype)


def post_clip_norm(spec: ClipSpec, grads: dict, dtype: str = "float64") -> dict:
    """Returns the norm after clipping instead of before (what gets logged as grad_norm)."""
    out = oracle.clip_and_norm(spec, grads, dtype)
    return {**out, "total_norm": oracle.total_norm(out["grads"], spec.norm_type)}


def strict_greater(spec: ClipSpec, grads: dict, dtype: str = "float64") -> dict:
    """`norm > max_norm` instead of optax's `>=`: leaves the exact threshold untouched."""
    out = oracle.clip_and_norm(spec, grads, dtype)
    if spec.max_norm is not None and spec.eps == 0 and out["total_norm"] == spec.max_norm:
        out = {**out, "grads": {k: np.asarray(v, np.float64) for k, v in grads.items()}}
    return out


def two_norm_always(spec: ClipSpec, grads: dict, dtype: str = "float64") -> dict:
    """Ignores norm_type (optax.clip_by_global_norm has only the 2-norm)."""
    return oracle.clip_and_norm(spec.model_copy(update={"norm_type": 2.0}), grads, dtype)


def textbook_division(spec: ClipSpec, grads: dict, dtype: str = "float64") -> dict:
    """(g / n) * c by true division, where optax (through XLA) multiplies by 1 / n."""
    out = oracle.clip_and_norm(spec, grads, dtype)
    n, c = out["total_norm"], spec.max_norm
    if spec.max_norm is not None and spec.eps == 0 and n >= c:
        out = {**out, "grads": {k: np.asarray(v, np.float64) / n * c for k, v in grads.items()}}
    return out


MUTANTS = {
    "no-eps": (no_eps, ["clip/exact-threshold-torch", "clip/small-norm-eps-gap-torch", "clip/seed-norm-torch-eps"]),
    "post-clip-norm": (post_clip_norm, ["clip/global-norm-above", "clip/seed-norm-formula"]),
    "strict-greater": (strict_greater, ["clip/exact-threshold-optax"]),
    "two-norm-always": (two_norm_always, ["clip/inf-norm", "clip/p3-norm", "clip/p1-norm"]),
    "textbook-division": (textbook_division, ["clip/exact-threshold-optax"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_wrong_clipper_is_caught(name: str) -> None:
    fn, must_fail = MUTANTS[name]
    for case_id in must_fail:
        case = CASES[case_id]
        assert run_case(case, Backend("oracle")).passed, f"{case_id} must pass on the real oracle"
        result = run_case(case, mutant(name, fn))
        assert not result.passed, f"mutant {name} passed {case_id}"
