"""Negative controls for optimizers: deliberately wrong variants (the classic porting mistakes between
torch.optim and optax) that the bundled optimizer cases must catch, on the oracle, JAX and torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.runner import run_case
from conformance.oracle import optimizers as oracle

CASES = {c.id: c for c in load_cases(only=["optimizer/*"])}


def _hp(optimizer: str, change: Callable[[str, dict], dict]) -> Callable[..., Any]:
    """Patch the oracle's per-parameter functions so that they see wrong hyper-parameters."""
    real_init, real_update = oracle.init_state, oracle.update

    def init(opt: str, hp: dict, p: np.ndarray) -> dict:
        return real_init(opt, change(opt, dict(hp)) if opt == optimizer else hp, p)

    def update(opt: str, hp: dict, p: np.ndarray, g: np.ndarray, s: dict, dtype: str = "float64"):
        return real_update(opt, change(opt, dict(hp)) if opt == optimizer else hp, p, g, s, dtype)

    return lambda mp: (mp.setattr(oracle, "init_state", init), mp.setattr(oracle, "update", update))


def _set(**values: Any) -> Callable[[str, dict], dict]:
    return lambda opt, hp: {**hp, **values}


def _no_bias_correction(mp: pytest.MonkeyPatch) -> None:
    real = oracle.update

    def update(opt: str, hp: dict, p: np.ndarray, g: np.ndarray, s: dict, dtype: str = "float64"):
        if opt != "adam":
            return real(opt, hp, p, g, s, dtype)
        new_p, new_s = real(opt, hp, p, g, s, dtype)  # keep the moments, redo the step uncorrected
        return p - hp["lr"] * new_s["m"] / (np.sqrt(new_s["v"]) + hp["eps"]), new_s

    mp.setattr(oracle, "update", update)


def _dampened_first_buffer(mp: pytest.MonkeyPatch) -> None:
    real = oracle.update

    def update(opt: str, hp: dict, p: np.ndarray, g: np.ndarray, s: dict, dtype: str = "float64"):
        if opt == "sgd" and hp["momentum"] and "momentum_buffer" not in s:
            s = {**s, "momentum_buffer": np.zeros_like(p)}  # optax-style: b0 = 0, so b1 = (1 - d)·g
        return real(opt, hp, p, g, s, dtype)

    mp.setattr(oracle, "update", update)


def _decay_without_lr(mp: pytest.MonkeyPatch) -> None:
    real = oracle.update

    def update(opt: str, hp: dict, p: np.ndarray, g: np.ndarray, s: dict, dtype: str = "float64"):
        if opt == "adamw":
            return real(opt, {**hp, "weight_decay": 0.0}, p * (1 - hp["weight_decay"]), g, s, dtype)
        return real(opt, hp, p, g, s, dtype)

    mp.setattr(oracle, "update", update)


def _cautious_without_plus_one(mp: pytest.MonkeyPatch) -> None:
    real = oracle.update

    def update(opt: str, hp: dict, p: np.ndarray, g: np.ndarray, s: dict, dtype: str = "float64"):
        if opt != "lion" or not hp["cautious"]:
            return real(opt, hp, p, g, s, dtype)
        b1, b2 = hp["betas"]
        p = p * (1 - hp["lr"] * hp["weight_decay"])
        g = -g if hp["maximize"] else g
        u = np.sign(b1 * s["m"] + (1 - b1) * g)
        m = (u * g > 0).astype(np.float64)
        u = u * m * (m.size / max(m.sum(), 1.0))
        return p - hp["lr"] * u, {**s, "m": b2 * s["m"] + (1 - b2) * g}

    mp.setattr(oracle, "update", update)


def _groups_ignored(mp: pytest.MonkeyPatch) -> None:
    real = oracle.resolve_groups

    def resolve(spec: Any, shapes: Any) -> list:
        top = spec.overrides()
        return [dataclasses.replace(g, hyperparams={**g.hyperparams, **{k: top[k] for k in g.hyperparams if k in top}})
                for g in real(spec, shapes)]

    mp.setattr(oracle, "resolve_groups", resolve)


def _missing_as_zero(spec: Any, params: dict, grads: list | None = None, **kw: Any) -> dict:
    filled = None if grads is None else [{k: g.get(k, np.zeros(np.shape(v))) for k, v in params.items()} for g in grads]
    return oracle.run_trajectory(spec, params, filled, **kw)


MUTANTS: dict[str, tuple[Any, list[str]]] = {
    # name: (patch or replacement run_trajectory, cases that must fail)
    "adam eps inside the sqrt (TF/Keras placement)": (
        _hp("adam", lambda o, hp: {**hp, "eps_root": hp["eps"], "eps": 0.0}), ["optimizer/torch-adam-open"]),
    "adam without bias correction": (_no_bias_correction, ["optimizer/seed-adam-first-step"]),
    "adam with decoupled decay (optax.adamw for torch Adam's L2)": (
        _hp("adam", _set(decoupled_weight_decay=True)), ["optimizer/seed-adam-l2-coupled"]),
    "adamw decay not multiplied by lr": (_decay_without_lr, ["optimizer/seed-adamw-decoupled"]),
    "sgd first buffer dampened (optax.ema / chain(scale, trace))": (_dampened_first_buffer, ["optimizer/torch-sgd-closed"]),
    "optax's amsgrad for torch's": (_hp("adam", lambda o, hp: {**hp, "amsgrad_variant": "optax"} if hp["amsgrad"] else hp),
                                    ["optimizer/torch-adam-closed"]),
    "rmsprop eps inside the sqrt (optax default)": (_hp("rmsprop", _set(eps_in_sqrt=True)), ["optimizer/torch-rmsprop-open"]),
    "adagrad with optax's defaults": (_hp("adagrad", _set(eps_in_sqrt=True, initial_accumulator_value=0.1, eps=1e-7)),
                                      ["optimizer/torch-adagrad-open"]),
    "nadam without the momentum schedule (optax.nadam)": (_hp("nadam", _set(momentum_schedule=False)),
                                                          ["optimizer/torch-nadam-open"]),
    "lion with optax's default weight decay 1e-3": (_hp("lion", lambda o, hp: {**hp, "weight_decay": hp["weight_decay"] or 1e-3}),
                                                    ["optimizer/optax-lion-open"]),
    "lion's cautious mask dropped": (_hp("lion", _set(cautious=False)),
                                     ["optimizer/pytorch-optimizer-lion-cautious-open",
                                      "optimizer/pytorch-optimizer-lion-cautious-closed"]),
    "lion's cautious mask scaled by n/Σm (without pytorch-optimizer's + 1)": (
        _cautious_without_plus_one, ["optimizer/pytorch-optimizer-lion-cautious-open"]),
    "muon without nesterov": (_hp("muon", lambda o, hp: {**hp, "nesterov": not hp["nesterov"]}), ["optimizer/torch-muon-open"]),
    "group hyper-parameters ignored": (_groups_ignored, ["optimizer/seed-param-groups", "optimizer/torch-sgd-groups"]),
    "no_weight_decay ignored": (_groups_ignored, ["optimizer/seed-no-decay-bias"]),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_oracle_mutant_is_caught(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    patch, must_fail = MUTANTS[mutant]
    for case_id in must_fail:
        assert run_case(CASES[case_id], Backend("oracle")).passed, f"{case_id} must pass unmutated"
    patch(monkeypatch)
    for case_id in must_fail:
        result = run_case(CASES[case_id], Backend("oracle"))
        assert not result.passed, f"{mutant}: {case_id} did not catch it"


def test_missing_gradient_as_zero_gradient_is_caught() -> None:
    """Treating `grad is None` as a zero gradient advances the state (and decays the weights)."""
    bad = PatchedBackend("oracle", patches=(("optimizers", "run_trajectory", _missing_as_zero),),
                         label="missing gradient as zero")
    for case_id in ("optimizer/torch-adam-open", "optimizer/torch-sgd-open", "optimizer/torch-adafactor-open"):
        assert run_case(CASES[case_id], Backend("oracle")).passed, f"{case_id} must pass unmutated"
        assert not run_case(CASES[case_id], bad).passed, case_id


def test_jax_mutant_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted bug in ref_jax's SGD momentum (first buffer dampened) fails the torch cases."""
    import jax

    from ref_jax import _elementwise

    init, update = _elementwise.LEAVES["sgd"]

    def dampened_first(g, s, p, hp, cfg):
        return update(g, s._replace(initialized=s.initialized | True), p, hp, cfg)

    case = CASES["optimizer/torch-sgd-closed"]
    assert run_case(case, Backend("jax")).passed
    monkeypatch.setitem(_elementwise.LEAVES, "sgd", (init, dampened_first))
    jax.clear_caches()  # the jitted step must see the planted bug
    try:
        assert not run_case(case, Backend("jax")).passed
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_torch_mutant_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without twinstep's float64 mu_product, torch's NAdam rounds its schedule product to float32
    (~1e-8 relative): the float64 cases generated under a float64 default dtype catch it."""

    from ref_torch import _assembly

    case = CASES["optimizer/torch-nadam-closed"]
    assert run_case(case, Backend("torch")).passed
    monkeypatch.setattr(_assembly, "_float64_mu_product", lambda *a: None)
    result = run_case(case, Backend("torch"))
    assert not result.passed and result.max_rel_err > 1e-10


def test_a_wrong_expected_value_fails() -> None:
    case = CASES["optimizer/seed-sgd-1d"]
    wrong = dataclasses.replace(case, raw_expected={"params": [{"theta": [2.6]}, {"theta": [3.08 + 1e-9]}]})
    broken = dataclasses.replace(wrong, expected=type(case.expected).model_validate(wrong.raw_expected))
    assert run_case(case, Backend("oracle")).passed and not run_case(broken, Backend("oracle")).passed
