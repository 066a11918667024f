"""The `train` conformance cases on both trainers, and the negative controls that plant a bug where
each trainer decides (the schedule stepped on skipped updates, injected overflows ignored, an
incomplete window divided by the configured steps) and must fail them."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
from support.trainers import CASES, Trainer, each_trainer

from conformance.config.precision import PrecisionSpec
from conformance.harness.backends import Backend
from conformance.harness.case import load_case
from conformance.harness.runner import run_case

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# the train cases and their negative controls
# ---------------------------------------------------------------------------------------------


def _case(name: str):
    return load_case(next(CASES.rglob(f"{name}.toml")))


@each_trainer("name", ["fp16-injected-overflows", "accumulation-incomplete-window"])
def test_train_cases_pass(trainer: Trainer, name: str) -> None:
    result = run_case(_case(name), Backend(trainer.name))
    assert result.passed, result.message


def _jax_steps_the_schedule_on_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    # the compiled step moves the schedule position itself (ref_jax._train_step): build it as if
    # schedule_on_skip were "advance"
    import ref_jax._steps as jt  # the trainer's framework steps build the compiled step

    real = jt.make_train_step

    def advancing(config: Any, *args: Any, **kw: Any) -> Any:
        precision = config.precision.model_copy(update={"schedule_on_skip": "advance"})
        return real(config.model_copy(update={"precision": precision}), *args, **kw)

    monkeypatch.setattr(jt, "make_train_step", advancing)


def test_schedule_stepped_on_skipped_updates_is_caught(trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(PrecisionSpec, "schedule_advances", lambda self, skipped: True)
    if trainer.name == "jax":
        _jax_steps_the_schedule_on_skips(monkeypatch)
    result = run_case(_case("fp16-injected-overflows"), Backend(trainer.name))
    assert not result.passed and result.message.startswith(("final_params", "lr"))


def test_injection_ignored_is_caught(trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.import_module(f"ref_{trainer.name}._steps"), "injected", lambda config, t: False)
    result = run_case(_case("fp16-injected-overflows"), Backend(trainer.name))
    assert not result.passed


def _torch_divides_by_the_configured_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from ref_torch import _update

    real = _update.accumulate_gradients

    def uncorrected(spec, loss_fn, params, window, *args, **kwargs):
        n = len(window)

        def scaled(p, mb):
            out = loss_fn(p, mb)
            return out._replace(value=out.value * n / spec.steps)

        return real(spec, scaled, params, window, *args, **kwargs)

    monkeypatch.setattr(_update, "accumulate_gradients", uncorrected)


def _jax_divides_by_the_configured_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    from ref_jax._window import WindowLayout

    real = WindowLayout.pad

    def padded_size(self, window, counts, inject=False):
        return {**real(self, window, counts, inject), "n": np.asarray(self.steps, self.real_dtype)}

    monkeypatch.setattr(WindowLayout, "pad", padded_size)


def test_incomplete_window_divided_by_the_configured_steps_is_caught(trainer: Trainer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-2024 accumulation bug: the last, shorter window divided by accumulation.steps (torch:
    seed 000's remainder correction left out; JAX: the padded window's size taken for its count)."""
    plant = {"torch": _torch_divides_by_the_configured_steps, "jax": _jax_divides_by_the_configured_steps}
    plant[trainer.name](monkeypatch)
    result = run_case(_case("accumulation-incomplete-window"), Backend(trainer.name))
    assert not result.passed
