"""Negative controls for the peers' optimizer semantics: deliberately wrong variants (PatchedBackend
mutants over the oracle's equations, and bugs planted in the twins) that the bundled cases generated
from torch, Keras, schedulefree and torch's AveragedModel must catch — decoupled decay applied after
the step or as L2, eps_hat without its √(1−β2ᵗ) factor or ignored, Keras's Nadam with torch's
momentum schedule, schedule-free without its warm-up or its lr-weighted average, the weights'
EMA from zeros, every update, or debiased as optax.ema, and AdEMAMix with optax's schedule count, without
its slow EMA or without its decay."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest

from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case
from conformance.oracle import optimizers as oracle

CASES = {c.id: c for c in load_cases(only=["optimizer/*"])}
Rewrite = Callable[..., tuple[np.ndarray, dict]]


def _mutant(label: str, rewrite: Rewrite | None = None, ema: Callable[[dict], dict] | None = None) -> PatchedBackend:
    """The oracle with its per-parameter update rewritten (rewrite(opt, hp, p, g, s, dtype, real))
    or its EMA trajectory replaced (ema(out) -> out)."""
    def run(spec: Any, params: Any, grads: Any = None, **kw: Any) -> dict:
        real = oracle.update
        if rewrite is None:
            out = oracle.run_trajectory(spec, params, grads, **kw)
        else:
            with mock.patch.object(oracle, "update", lambda o, hp, p, g, s, dtype="float64":
                                   rewrite(o, dict(hp), p, g, s, dtype, real)):
                out = oracle.run_trajectory(spec, params, grads, **kw)
        return ema(out) if ema is not None and kw.get("ema") is not None else out

    return PatchedBackend("oracle", patches=(("optimizers", "run_trajectory", run),), label=label)


def _decay_after_step(o, hp, p, g, s, dtype, real):
    if not hp.get("decoupled_weight_decay"):
        return real(o, hp, p, g, s, dtype)
    new_p, s = real(o, {**hp, "weight_decay": 0.0}, p, g, s, dtype)
    return new_p * (1 - hp["lr"] * hp["weight_decay"]), s


def _set(key: str, value: Any, when: Callable[[str, dict], bool] = lambda o, hp: True) -> Rewrite:
    return lambda o, hp, p, g, s, dtype, real: real(o, {**hp, key: value} if key in hp and when(o, hp) else hp,
                                                    p, g, s, dtype)


def _eps_hat_without_factor(o, hp, p, g, s, dtype, real):
    if o not in ("adam", "adamw") or not hp.get("eps_hat"):
        return real(o, hp, p, g, s, dtype)
    new_p, s = real(o, hp, p, g, s, dtype)  # keep the moments, redo the step without sqrt(1 - b2^t)
    b1 = hp["betas"][0]
    t = int(s["step"])
    decayed = p * (1 - hp["lr"] * hp["weight_decay"]) if o == "adamw" or hp["decoupled_weight_decay"] else p
    second = s["v_max"] if hp["amsgrad"] else s["v"]
    return decayed - hp["lr"] / (1 - b1 ** t) * s["m"] / (np.sqrt(second) + hp["eps"]), s


def _ema_from_zeros(out: dict) -> dict:  # ema_0 = (1 - decay)·p: optax.ema(debias=False) from zeros
    first = next(i for i, e in enumerate(out["ema"]) if e is not None)
    out["ema"] = [None if e is None else {k: v - (0.0 if i > first else out["ema"][first][k] * 0.5)
                                          for k, v in e.items()} for i, e in enumerate(out["ema"])]
    return out


def _ema_every_update(decay: float) -> Callable[[dict], dict]:
    def rewrite(out: dict) -> dict:
        ema, average = [], None
        for p in out["params"]:
            average = dict(p) if average is None else {k: decay * average[k] + (1 - decay) * p[k] for k in p}
            ema.append(average)
        out["ema"] = ema
        return out
    return rewrite


_ALPHA, _BETA3 = oracle.ademamix_alpha, oracle.ademamix_beta3


def _warmups_one_count_behind(o, hp, p, g, s, dtype, real):  # optax.contrib's count_m2 (AD-COUNT)
    with mock.patch.object(oracle, "ademamix_alpha", lambda hp, t: _ALPHA(hp, t - 1)), \
            mock.patch.object(oracle, "ademamix_beta3", lambda hp, t: _BETA3(hp, t - 1)):
        return real(o, hp, p, g, s, dtype)


ADEMAMIX = ["optimizer/optax-ademamix-open", "optimizer/optax-ademamix-closed"]
MUTANTS: dict[str, tuple[PatchedBackend, list[str]]] = {
    "ademamix warm-ups at optax's count (one behind t)": (_mutant("warm-ups behind", _warmups_one_count_behind), [
        "optimizer/optax-ademamix-warmup", "optimizer/optax-ademamix-beta1-zero"]),
    "ademamix without its slow EMA (alpha 0)": (_mutant("no slow EMA", _set("alpha", 0.0, lambda o, hp: o == "ademamix")),
                                                 [*ADEMAMIX, "optimizer/optax-ademamix-warmup"]),
    "ademamix without weight decay": (_mutant("no decay", _set("weight_decay", 0.0, lambda o, hp: o == "ademamix")),
                                      ["optimizer/optax-ademamix-closed", "optimizer/optax-ademamix-warmup"]),
    "decoupled decay after the step": (_mutant("decay after", _decay_after_step), [
        "optimizer/torch-sgd-decoupled", "optimizer/torch-rmsprop-decoupled", "optimizer/torch-adagrad-decoupled",
        "optimizer/torch-adamax-decoupled", "optimizer/keras-sgd-weight-decay", "optimizer/keras-rmsprop-weight-decay"]),
    "decoupled decay as torch's L2": (_mutant("L2", _set("decoupled_weight_decay", False)), [
        "optimizer/keras-rmsprop-weight-decay-test", "optimizer/keras-adagrad-weight-decay-test",
        "optimizer/keras-adamax-weight-decay", "optimizer/keras-adagrad-weight-decay", "optimizer/keras-nadam"]),
    "eps_hat without sqrt(1 - beta2^t)": (_mutant("no factor", _eps_hat_without_factor), [
        "optimizer/keras-adamw-golden", "optimizer/torch-adam-eps-hat", "optimizer/keras-adam-eps-hat"]),
    "eps_hat ignored (torch's placement)": (_mutant("no eps_hat", _set("eps_hat", False)), [
        "optimizer/keras-adamw-golden", "optimizer/keras-adamax-eps-hat", "optimizer/torch-nadam-eps-hat",
        "optimizer/torch-adamw-eps-hat-amsgrad", "optimizer/keras-adamw-eps-hat"]),
    "keras nadam with torch's momentum_decay 4e-3": (
        _mutant("torch nadam", _set("momentum_decay", 4e-3, lambda o, hp: hp.get("momentum_decay") == 1.0)),
        ["optimizer/keras-nadam-golden", "optimizer/keras-nadam"]),
    "schedule-free without its warm-up": (_mutant("no warm-up", _set("warmup_steps", 0)), [
        "optimizer/schedulefree-adamw-open", "optimizer/schedulefree-sgd-open", "optimizer/schedulefree-adamw-groups"]),
    "schedule-free average not weighted by lr_max": (_mutant("flat average", _set("weight_lr_power", 0.0)), [
        "optimizer/schedulefree-adamw-open", "optimizer/schedulefree-sgd-open"]),
    "schedule-free decay at z, not y": (_mutant("decay at z", lambda o, hp, p, g, s, dtype, real: real(
        o, hp, p, g + (hp["weight_decay"] * (s.get("z", p) - p) if o.startswith("schedule_free") and "z" in s else 0),
        s, dtype)), ["optimizer/schedulefree-adamw-open", "optimizer/schedulefree-sgd-open"]),
    "ema from zeros (no first copy)": (_mutant("ema zeros", ema=_ema_from_zeros), [
        "optimizer/ema-torch-sgd", "optimizer/ema-keras-adam", "optimizer/ema-torch-adamw-every-start"]),
    "ema every update (every and start ignored)": (_mutant("ema always", ema=_ema_every_update(0.5)), [
        "optimizer/ema-torch-adamw-every-start"]),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(mutant: str) -> None:
    backend, must_fail = MUTANTS[mutant]
    for case_id in must_fail:
        assert run_case(CASES[case_id], Backend("oracle")).passed, f"{case_id} must pass unmutated"
        assert not run_case(CASES[case_id], backend).passed, f"{mutant}: {case_id} did not catch it"


def test_jax_decoupled_decay_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug in ref_jax: the decoupled flag of sgd/rmsprop/adagrad/adamax ignored (L2)."""
    import jax

    from ref_jax import _assembly

    case = CASES["optimizer/torch-rmsprop-decoupled"]
    assert run_case(case, Backend("jax")).passed
    real = _assembly.group_options

    def coupled(group):
        dynamic, static = real(group)
        return dynamic, {**static, "decoupled": group.optimizer == "adamw"}

    monkeypatch.setattr(_assembly, "group_options", coupled)
    jax.clear_caches()
    try:
        assert not run_case(case, Backend("jax")).passed
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_torch_decay_after_the_step_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug in ref_torch: DecoupledDecay running the class's step first, the decay after."""
    import torch

    from ref_torch import _elementwise

    case = CASES["optimizer/torch-sgd-decoupled"]
    assert run_case(case, Backend("torch")).passed

    @torch.no_grad()
    def late(self, closure=None):
        own = next(c for c in type(self).__mro__ if c.__module__.startswith("torch.optim")).step
        held = [(g, g["weight_decay"]) for g in self.param_groups]
        for g, _ in held:
            g["weight_decay"] = 0.0
        (own.__wrapped__ if getattr(own, "hooked", False) else own)(self)
        for g, wd in held:
            g["weight_decay"] = wd
            torch._foreach_mul_([p for p in g["params"] if p.grad is not None], 1 - g["lr"] * wd)

    monkeypatch.setattr(_elementwise.DecoupledSGD, "step", late)  # the class torch has hooked
    assert not run_case(case, Backend("torch")).passed
