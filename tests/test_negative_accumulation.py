"""Negative controls for accumulation: the classic bugs, each caught by the bundled accumulate cases
and by the full-batch property."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conformance.config.accumulation import AccumulationSpec
from conformance.config.loss import LossSpec
from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case
from conformance.oracle import accumulation as oracle

CASES = {c.id: c for c in load_cases(only=["accumulate/*"])}


def mutant(name: str, fn: Callable[..., Any]) -> PatchedBackend:
    """The oracle with accumulation.window_gradients replaced by a wrong variant."""
    return PatchedBackend("oracle", patches=(("accumulation", "window_gradients", fn),), label=name)


def _scale(out: dict, factors: list[float]) -> dict:
    grads = [{k: v * f for k, v in g.items()} for g, f in zip(out["grads"], factors)]
    return {**out, "grads": grads, "loss": [v * f for v, f in zip(out["loss"], factors)]}


def no_division(loss: LossSpec, spec: AccumulationSpec, params, batches, dtype="float64") -> dict:
    """Backpropagates the micro-batch losses undivided: forgets the window's divisor (n or N; seed 000:
    the accumulated gradient becomes 'A 倍')."""
    out = oracle.window_gradients(loss, spec, params, batches, dtype)
    return _scale(out, out["count"])


def mean_of_token_means(loss: LossSpec, spec: AccumulationSpec, params, batches, dtype="float64") -> dict:
    """Averages per-micro-batch means when tokens were asked for (the 2024 HF bug)."""
    return oracle.window_gradients(loss, spec.model_copy(update={"normalize": "micro_batches"}), params, batches, dtype)


def configured_steps_divisor(loss: LossSpec, spec: AccumulationSpec, params, batches, dtype="float64") -> dict:
    """Divides the incomplete last window by `steps` instead of its real size (ms-swift #10084)."""
    out = oracle.window_gradients(loss, spec, params, batches, dtype)
    if spec.normalize == "tokens":
        return out
    return _scale(out, [n / spec.steps for n in spec.windows(len(batches))])


def drops_last_window(loss: LossSpec, spec: AccumulationSpec, params, batches, dtype="float64") -> dict:
    """Ignores last_window = "update" and drops the remainder (burn #5695, PL #4653)."""
    return oracle.window_gradients(loss, spec.model_copy(update={"last_window": "drop"}), params, batches, dtype)


MUTANTS = {
    "no-division": (no_division, ["accumulate/seed-000-incomplete-window", "accumulate/tokens-1-15",
                                  "accumulate/seed-formula-micro-batches"]),
    "mean-of-token-means": (mean_of_token_means, ["accumulate/tokens-1-15", "accumulate/tokens-k4-zero-token-partial",
                                                  "accumulate/seed-formula-tokens", "accumulate/tokens-mse-masked"]),
    "configured-steps-divisor": (configured_steps_divisor, ["accumulate/seed-000-incomplete-window"]),
    "drops-last-window": (drops_last_window, ["accumulate/seed-000-incomplete-window",
                                              "accumulate/equals-full-batch-partial"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_wrong_accumulation_is_caught_by_cases(name: str) -> None:
    fn, must_fail = MUTANTS[name]
    for case_id in must_fail:
        assert run_case(CASES[case_id], Backend("oracle")).passed, f"{case_id} must pass on the real oracle"
        assert not run_case(CASES[case_id], mutant(name, fn)).passed, f"mutant {name} passed {case_id}"


def test_mean_of_means_differs_from_the_full_batch_by_the_closed_form() -> None:
    # conformance_anchors.md §7: with token counts 1 and 15 the bug's error has a closed form,
    # (1/2)·g1 + (1/2)·ḡ15 versus (1/16)·g1 + (15/16)·ḡ15, so the controls above cannot pass by luck
    rng = np.random.default_rng(4)
    loss = LossSpec(name="cross_entropy")
    params = {"w": rng.normal(size=(2, 3)), "b": np.zeros(3)}
    mb = [{"x": rng.normal(size=(4, 2)), "y": np.array([0, -100, -100, -100])},
          {"x": rng.normal(size=(16, 2)), "y": rng.integers(0, 3, size=16)}]
    mb[1]["y"][15] = -100
    g1 = oracle.full_batch_gradients(loss, params, [mb[0]])[0]
    g15 = oracle.full_batch_gradients(loss, params, [mb[1]])[0]
    right = oracle.window_gradients(loss, AccumulationSpec(steps=2, normalize="tokens"), params, mb)["grads"][0]
    wrong = mean_of_token_means(loss, AccumulationSpec(steps=2, normalize="tokens"), params, mb)["grads"][0]
    for k in right:
        np.testing.assert_allclose(right[k], g1[k] / 16 + g15[k] * 15 / 16, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(wrong[k], (g1[k] + g15[k]) / 2, rtol=1e-12, atol=1e-15)
        assert np.abs(right[k] - wrong[k]).max() > 1e-3
