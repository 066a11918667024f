"""Neutral optimizer state (docs/contract.md §4): names, export/import round trips, bit-identical
continuation after a reload, and a run handed from torch to JAX (and back) mid-way."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from support.optimizers import spec_of

from conformance.config.optimizer import OPTIMIZER_NAMES
from conformance.errors import InputError
from conformance.rules.groups import resolve_groups
from conformance.rules.state import state_shapes
from ref_jax import optimizers as jo
from ref_jax.backend import context
from ref_torch import optimizers as to

OPTIONS = {"sgd": {"momentum": 0.9, "dampening": 0.2}, "adam": {"amsgrad": True}, "rmsprop": {"centered": True, "momentum": 0.5},
           "adagrad": {"lr_decay": 0.1}, "nadam": {"weight_decay": 0.1}, "muon": {"ns_dtype": "float64"},
           "adafactor": {"weight_decay": 0.1},
           # warm-ups crossing the reload after 3 updates, counted per parameter (b misses update 1)
           "ademamix": {"alpha": 5.0, "alpha_warmup": 4, "beta3_warmup": 5, "weight_decay": 0.1}}
SHAPES = {"w": (3, 2), "k": (2, 2, 3), "b": (2,)}


def _spec(name: str):
    return spec_of({"name": name, "lr": 0.05, **OPTIONS.get(name, {})})


def _stream(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = [{k: rng.standard_normal(s) for k, s in SHAPES.items()} for _ in range(n)]
    if n > 1:
        del out[1]["b"]  # a missing gradient on the way: per-parameter counts differ
    return out


def _start() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(42)
    return {k: rng.standard_normal(s) for k, s in SHAPES.items()}


class TorchRun:
    def __init__(self, name: str) -> None:
        self.params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in _start().items()}
        self.opt = to.build_optimizer(_spec(name), self.params.items())

    def step(self, grads: dict) -> None:
        for k, p in self.params.items():
            p.grad = None if k not in grads else torch.tensor(grads[k])
        self.opt.step()

    def values(self) -> dict[str, np.ndarray]:
        return {k: p.detach().numpy().copy() for k, p in self.params.items()}

    def export(self) -> dict:
        return to.export_state(self.opt)

    def load(self, params: dict, neutral: dict) -> None:
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(torch.tensor(params[k]))
        to.import_state(self.opt, neutral)


class JaxRun:
    def __init__(self, name: str) -> None:
        self.params = {k: jnp.asarray(v) for k, v in _start().items()}
        self.tx = jo.build_optimizer(_spec(name), self.params)
        self.state = self.tx.init(self.params)

    def step(self, grads: dict) -> None:
        g = {k: jnp.asarray(grads.get(k, np.zeros(s))) for k, s in SHAPES.items()}
        present = {k: jnp.asarray(k in grads) for k in SHAPES}
        # ref_jax's jitted update + apply_updates (cached by the static plan: one compile per spec)
        self.params, self.state = jo._step(self.params, g, present, self.state)

    def values(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.params.items()}

    def export(self) -> dict:
        return jo.export_state(self.state)

    def load(self, params: dict, neutral: dict) -> None:
        self.params = {k: jnp.asarray(v) for k, v in params.items()}
        self.state = jo.import_state(self.state, neutral)


RUNS = {"torch": TorchRun, "jax": JaxRun}


@pytest.fixture(autouse=True)
def _x64():
    with context():
        yield


def _names(name: str) -> dict[str, set[str]]:
    spec = _spec(name)
    groups = resolve_groups(spec, SHAPES)
    return {n: set(state_shapes(g.optimizer, g.hyperparams, SHAPES[n])) for g in groups for n in g.names}


@pytest.mark.parametrize("side", RUNS)
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_export_uses_the_neutral_names(name: str, side: str) -> None:
    run = RUNS[side](name)
    for g in _stream(2):
        run.step(g)
    neutral = run.export()
    want = _names(name)
    assert {k: set(v) for k, v in neutral["state"].items()} == want
    for param, entries in neutral["state"].items():
        group = next(g for g in resolve_groups(_spec(name), SHAPES) if param in g.names)
        shapes = state_shapes(group.optimizer, group.hyperparams, SHAPES[param])
        assert {k: np.shape(v) for k, v in entries.items()} == shapes
    assert neutral["step"] == 2 and int(neutral["state"]["b"]["step"]) == 1


@pytest.mark.parametrize("side", RUNS)
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_reload_continues_bit_identically(name: str, side: str) -> None:
    """Export after 3 updates, import into a fresh optimizer, 3 more: equal to the bit (float64, CPU)."""
    stream = _stream(6)
    straight = RUNS[side](name)
    for g in stream:
        straight.step(g)
    first = RUNS[side](name)
    for g in stream[:3]:
        first.step(g)
    params, neutral = first.values(), first.export()
    again = RUNS[side](name)
    again.load(params, neutral)
    exported = again.export()
    for param, entries in neutral["state"].items():
        for key, value in entries.items():
            np.testing.assert_array_equal(exported["state"][param][key], value, err_msg=f"{param}.{key}")
    for g in stream[3:]:
        again.step(g)
    for k, v in straight.values().items():
        np.testing.assert_array_equal(again.values()[k], v, err_msg=f"{name} {side} {k}")


@pytest.mark.parametrize(("source", "target"), [("torch", "jax"), ("jax", "torch")])
@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_handoff_between_frameworks_continues_the_trajectory(name: str, source: str, target: str) -> None:
    """A run moved mid-way (parameters and neutral state) continues as if it had never moved."""
    stream = _stream(6)
    straight = RUNS[source](name)
    for g in stream:
        straight.step(g)
    first = RUNS[source](name)
    for g in stream[:3]:
        first.step(g)
    moved = RUNS[target](name)
    moved.load(first.values(), first.export())
    for g in stream[3:]:
        moved.step(g)
    for k, v in straight.values().items():
        err = np.max(np.abs(moved.values()[k] - v)) / np.max(np.abs(v))
        assert err <= 1e-12, f"{name} {source}->{target} {k}: {err:.2e}"
    ours, theirs = moved.export()["state"], straight.export()["state"]
    assert set(ours) == set(theirs)
    for param in theirs:
        for key, value in theirs[param].items():
            np.testing.assert_allclose(ours[param][key], value, rtol=1e-12, atol=1e-15, err_msg=f"{param}.{key}")


@pytest.mark.parametrize("side", RUNS)
@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s["state"].update(x={"step": 1}), "optimizer state names parameter 'x', which the model does not have"),
    (lambda s: s["state"]["w"].pop("v"), "optimizer state of 'w' (adam) must hold ['m', 'step', 'v', 'v_max']"),
    (lambda s: s["state"]["w"].update(m=np.zeros(3)), "optimizer state 'w'.m must have shape (3, 2); received (3,)"),
    (lambda s: s["state"]["w"].update(m=np.full((3, 2), np.nan)), "optimizer state 'w'.m contains a non-finite value"),
    (lambda s: s["state"]["w"].update(step=np.asarray(-1)), "optimizer state 'w'.step must be a non-negative integer"),
    (lambda s: s.pop("state"), "a neutral optimizer state is a table"),
])
def test_bad_state_is_refused_with_the_same_message(side: str, edit, message: str) -> None:
    source = RUNS[side]("adam")
    for g in _stream(2):
        source.step(g)
    neutral = source.export()
    edit(neutral)
    target = RUNS[side]("adam")
    with pytest.raises(InputError) as err:
        target.load(source.values(), neutral)
    assert message in str(err.value), str(err.value)


def test_nadam_keeps_a_float64_mu_product_for_float64_parameters() -> None:
    """torch's NAdam keeps mu_product in float32 unless the global default dtype is float64."""
    run = TorchRun("nadam")
    run.step(_stream(1)[0])
    assert run.opt.state[run.params["w"]]["mu_product"].dtype == torch.float64
    assert torch.get_default_dtype() == torch.float32


def test_torch_state_dict_round_trips_for_muon_with_fallback() -> None:
    run = TorchRun("muon")
    for g in _stream(2):
        run.step(g)
    before = run.export()
    run.opt.load_state_dict(run.opt.state_dict())  # the inner optimizers must still share state
    run.step(_stream(3, seed=1)[0])
    assert run.export()["step"] == before["step"] + 1
