"""Negative controls for mixed precision and the non-finite policy: wrong variants that the
loss_scale cases and the update-path checks must catch."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from test_update_path import F64, assert_trace_close, make_data, run_torch, seed_loop

from conformance.config.clip import ClipSpec
from conformance.config.precision import PrecisionSpec
from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case
from conformance.oracle import precision as oracle
from ref_torch import clipping as tc
from ref_torch import precision as tp

CASES = {c.id: c for c in load_cases(only=["loss_scale/*"])}


def mutant(name: str, fn: Callable[..., Any]) -> PatchedBackend:
    """The oracle with precision.loss_scale_trace replaced by a wrong variant."""
    return PatchedBackend("oracle", patches=(("precision", "loss_scale_trace", fn),), label=name)


def jmp_like(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict:
    """jmp.DynamicLossScale: one factor (growth_factor) for both ways and a floor at 1."""
    scale, counter = np.float32(spec.init_scale), 0
    out: dict[str, list] = {"scale": [], "skipped": [], "growth_tracker": []}
    for ok in finite:
        out["scale"].append(float(scale))
        out["skipped"].append(not ok)
        if ok:
            grown = np.float32(scale * spec.growth_factor)
            scale = grown if counter == spec.growth_interval - 1 and np.isfinite(grown) else scale
            counter = (counter + 1) % spec.growth_interval
        else:
            scale, counter = max(np.float32(1.0), np.float32(scale / spec.growth_factor)), 0
        out["growth_tracker"].append(counter)
    return out


def scale_after_update(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict:
    """Reports the scale after update() instead of the one the update used (an off-by-one)."""
    out = oracle.loss_scale_trace(spec, finite)
    scales, tracker, scale = [], 0, np.float32(spec.init_scale)
    for ok in finite:
        scale, tracker = oracle.update_scale(spec, scale, tracker, ok)
        scales.append(float(scale))
    return {**out, "scale": scales}


def never_stops(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict:
    """GradScaler alone: skips forever, no consecutive-skip limit."""
    return oracle.loss_scale_trace(spec.model_copy(update={"max_consecutive_skips": None}), finite)


MUTANTS = {
    "jmp-like": (jmp_like, ["loss_scale/no-floor", "loss_scale/asymmetric-factors"]),
    "scale-after-update": (scale_after_update, ["loss_scale/seed-backoff-by-hand", "loss_scale/random-40"]),
    "never-stops": (never_stops, ["loss_scale/consecutive-skip-limit"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_wrong_loss_scaler_is_caught_by_cases(name: str) -> None:
    fn, must_fail = MUTANTS[name]
    for case_id in must_fail:
        assert run_case(CASES[case_id], Backend("oracle")).passed, f"{case_id} must pass on the real oracle"
        assert not run_case(CASES[case_id], mutant(name, fn)).passed, f"mutant {name} passed {case_id}"


class ClipFirstScaler(tp.LossScaler):
    """Clips the still-scaled gradients, then unscales: the order seed 000 warns against."""

    def unscale(self, grads: Any) -> tuple[Any, Any]:
        tc.clip_gradients(ClipSpec(max_norm=0.5), grads)
        return super().unscale(grads)


def test_clipping_before_unscaling_is_caught(monkeypatch) -> None:
    params, batches = make_data()
    precision = PrecisionSpec(**F64)
    want = seed_loop(params, batches, precision, "tokens")
    with pytest.raises(AssertionError):
        monkeypatch.setattr(tp, "LossScaler", ClipFirstScaler)
        assert_trace_close(run_torch(params, batches, precision, "tokens"), want, atol=1e-12, rtol=1e-10)
    monkeypatch.undo()
    assert_trace_close(run_torch(params, batches, precision, "tokens"), want, atol=1e-12, rtol=1e-10)


def test_schedule_advancing_on_skips_is_caught() -> None:
    # the default is hold; a trainer that steps its scheduler anyway (seed 000's loop, DeepSpeed
    # #8415) produces the `advance` trace, which the hold reference rejects
    params, batches = make_data()
    want = seed_loop(params, batches, PrecisionSpec(**F64), "micro_batches")
    wrong = run_torch(params, batches, PrecisionSpec(schedule_on_skip="advance", **F64), "micro_batches")
    with pytest.raises(AssertionError):
        assert_trace_close(wrong, want, atol=1e-12, rtol=1e-10)


def test_applying_nonfinite_updates_is_caught() -> None:
    # optax.apply_if_finite gives up after max_consecutive_errors and applies the NaN update
    # (reliability.md §4.2); the untouched-parameters check that test_update_path uses rejects it
    params = {"w": jnp.array([1.0, 2.0])}
    tx = optax.apply_if_finite(optax.sgd(0.1), max_consecutive_errors=1)
    state = tx.init(params)
    history = [params]
    for _ in range(3):
        updates, state = tx.update({"w": jnp.array([jnp.nan, 1.0])}, state, params)
        params = optax.apply_updates(params, updates)
        history.append(params)
    assert np.array_equal(history[1]["w"], history[0]["w"])  # the first one is skipped ...
    with pytest.raises(AssertionError):  # ... the later ones corrupt the parameters
        for before, after in zip(history, history[1:]):
            np.testing.assert_array_equal(np.asarray(after["w"]), np.asarray(before["w"]))
    assert math.isnan(float(history[-1]["w"][0]))


def test_checking_only_scaled_gradients_is_caught() -> None:
    # GradScaler's kernel alone checks the scaled value; below scale 1 an unscaled inf slips through
    def scaled_only(scale: float, grads: list[Any]) -> bool:
        found = torch.zeros(())
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.tensor(1.0 / scale))
        return float(found) == 0

    def ours(scale: float, grads: list[Any]) -> bool:
        state = tp.LossScaleState(torch.tensor(scale), torch.tensor(0, dtype=torch.int32))
        return bool(tp.unscale_grads(state, {str(i): g for i, g in enumerate(grads)})[1])

    for check, caught in ((ours, True), (scaled_only, False)):
        finite = check(2.0**-10, [torch.tensor([1e38]), torch.tensor([1.0])])
        assert finite is not caught


@jax.enable_x64(True)
def test_float32_factor_arithmetic_is_caught_by_the_inexact_factor_case() -> None:
    def float32_factors(spec: PrecisionSpec, finite: list[bool], dtype: str = "float64") -> dict:
        scale, tracker = np.float32(spec.init_scale), 0
        out: dict[str, list] = {"scale": [], "skipped": [], "growth_tracker": []}
        for ok in finite:
            out["scale"].append(float(scale))
            out["skipped"].append(not ok)
            f = np.float32(spec.growth_factor if ok else spec.backoff_factor)
            grow = ok and tracker + 1 == spec.growth_interval
            scale = np.float32(scale * f) if (grow or not ok) else scale
            tracker = 0 if (grow or not ok) else tracker + 1
            out["growth_tracker"].append(tracker)
        return out

    case = CASES["loss_scale/inexact-factors"]
    assert not run_case(case, mutant("float32 factors", float32_factors)).passed
    assert run_case(case, Backend("jax")).passed
