"""Shared helpers of the optimizer tests (no tests here): specs, random trajectories, error measures."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from conformance.config import load_config
from conformance.config.optimizer import OPTIMIZER_NAMES, OptimizerSpec
from conformance.harness.backends import Backend

BACKENDS = ("torch", "jax", "oracle")


def spec_of(table: dict[str, Any]) -> OptimizerSpec:
    return load_config({"optimizer": table}).optimizer


def run_all(spec: OptimizerSpec, params: dict, grads: list | None, dtype: str = "float64",
            backends: tuple[str, ...] = BACKENDS, **kwargs: Any) -> dict[str, dict]:
    """run_trajectory on each backend, inside its numerics context."""
    out = {}
    for name in backends:
        b = Backend(name)
        with b.context():
            out[name] = b.function("optimizers", "run_trajectory")(spec, params, grads, dtype=dtype, **kwargs)
    return out


def _rel(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    if b.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def worst(got: dict, want: dict, states: bool = True) -> float:
    """Largest normwise relative error max|got − want| / max|want| over every update, parameter and
    (with states) state array; a trajectory of another length (a missing or extra update) and a
    missing or extra parameter or state entry are infinitely wrong."""
    err = 0.0
    if len(got["params"]) != len(want["params"]):
        return float("inf")
    for g, w in zip(got["params"], want["params"]):
        if set(g) != set(w):
            return float("inf")
        err = max(err, *(_rel(g[k], w[k]) for k in w))
    if states:
        if len(got["state"]) != len(want["state"]):
            return float("inf")
        for g, w in zip(got["state"], want["state"]):
            if set(g) != set(w) or any(set(g[k]) != set(w[k]) for k in w):
                return float("inf")
            for k in w:
                err = max(err, *(_rel(g[k][n], w[k][n]) for n in w[k]))
    return err


def _options(draw: Any, name: str, group: bool = False) -> dict[str, Any]:
    f = lambda lo, hi: draw(st.floats(lo, hi, allow_nan=False))  # noqa: E731
    o: dict[str, Any] = {"lr": f(1e-4, 0.3)}
    if draw(st.booleans()):
        o["weight_decay"] = f(0.0, 0.3)
    if name not in ("sgd", "rmsprop", "adagrad", "adafactor", "muon", "schedule_free_sgd"):
        # schedule-free AdamW's evaluation point divides by β1: β1 > 0 there (a ConfigError at 0)
        # prodigy: β1 = 0 steps a group whose lr is 0 by dlr·g/ε (prodigyopt 1.1.2; cases pin it), too wild to draw
        o["betas"] = [f(0.05 if name in ("schedule_free_adamw", "prodigy") else 0.0, 0.99), f(0.5, 0.9999)]
    if name in ("adam", "adamw", "adamax", "nadam", "radam", "rmsprop", "adagrad", "schedule_free_adamw"):
        o["eps"] = 10 ** f(-10, -2)
    if name in ("schedule_free_adamw", "schedule_free_sgd"):
        if name == "schedule_free_sgd":
            o["momentum"] = f(0.05, 0.95)
        if not group:
            o.update(warmup_steps=draw(st.integers(0, 6)), r=f(0.0, 1.0), weight_lr_power=f(0.0, 3.0))
    if name == "sgd":
        o["momentum"] = f(0.05, 0.99)
        if not group and draw(st.booleans()):
            o["dampening"] = f(0.0, 0.5)
        elif not group:
            o["nesterov"] = draw(st.booleans())
    elif name in ("adam", "adamw") and not group:
        o["amsgrad"] = draw(st.booleans())
        if o["amsgrad"]:
            o["amsgrad_variant"] = draw(st.sampled_from(["torch", "optax", "optax_raw"]))
        if draw(st.booleans()):
            o["eps_root"] = 10 ** f(-12, -4)
        elif o.get("amsgrad_variant", "torch") == "torch" and draw(st.booleans()):
            o["eps_hat"] = True
    elif name == "rmsprop":
        o.update(alpha=f(0.5, 0.999), momentum=draw(st.sampled_from([0.0, 0.5, 0.9])))
        if not group:
            o.update(centered=draw(st.booleans()), eps_in_sqrt=draw(st.booleans()))
    elif name == "adagrad":
        o["lr_decay"] = f(0.0, 0.2)
        if not group:
            o.update(initial_accumulator_value=f(0.0, 0.5), eps_in_sqrt=draw(st.booleans()))
    elif name == "nadam":
        o["momentum_decay"] = f(0.0, 0.05)
        if not group and draw(st.booleans()):
            o = {k: v for k, v in o.items() if k != "momentum_decay"} | {"momentum_schedule": False}
    elif name == "adafactor":
        o.update(beta2_decay=f(-1.0, -0.2), d=f(1.0, 3.0), eps=[draw(st.sampled_from(["auto", 1e-20])), f(1e-4, 1e-2)])
    elif name == "ademamix":
        o.update(beta3=f(0.9, 0.9999), alpha=f(0.0, 8.0))
        if not group:
            o.update(alpha_warmup=draw(st.integers(0, 6)), beta3_warmup=draw(st.integers(0, 6)))
    elif name == "prodigy":  # a group takes the lr or 0, its own weight_decay and eps; the rest is global
        o["eps"] = 10 ** f(-10, -2)
        if group:
            o = {"lr": draw(st.sampled_from([None, 0.0]))} | {k: v for k, v in o.items() if k in ("weight_decay", "eps")}
            o = {k: v for k, v in o.items() if v is not None}
        else:
            o.update(use_bias_correction=draw(st.booleans()), safeguard_warmup=draw(st.booleans()),
                     decouple=draw(st.booleans()), d0=10 ** f(-6, -2), d_coef=f(0.5, 2.0),
                     growth_rate=draw(st.sampled_from([float("inf"), 1.02, 2.0])))
            if draw(st.booleans()):
                o["beta3"] = f(0.5, 0.999)
    elif name == "muon":
        o.update(momentum=f(0.5, 0.99), ns_dtype="float64", eps=10 ** f(-9, -5))
        if not group:
            o.update(nesterov=draw(st.booleans()), adjust_lr_fn=draw(st.sampled_from(["original", "match_rms_adamw"])),
                     ns_steps=draw(st.integers(1, 6)))
    if name in ("adamax", "nadam") and not group and draw(st.booleans()):
        o["eps_hat"] = True
    if name in ("sgd", "rmsprop", "adagrad", "adamax", "nadam", "radam", "adam") and not group and draw(st.booleans()):
        o["decoupled_weight_decay"] = True
    if name not in ("muon", "schedule_free_adamw", "schedule_free_sgd", "prodigy") and draw(st.integers(0, 4)) == 0:
        o["maximize"] = True
    if (name in ("adamw", "lion", "muon", "ademamix") or o.get("decoupled_weight_decay")) and draw(st.booleans()):
        o["cautious_weight_decay"] = True
    return o


@st.composite
def random_spec(draw: Any, updates: int = 20) -> tuple[OptimizerSpec, dict, list]:
    """(spec, params, grads): any optimizer, options, maybe a group, a gradient stream with holes."""
    name = draw(st.sampled_from(OPTIMIZER_NAMES))
    table: dict[str, Any] = {"name": name, **_options(draw, name)}
    names = ["a.weight", "a.bias", "b.weight"]
    shapes = {n: (draw(st.integers(1, 3)), draw(st.integers(1, 3))) if n.endswith("weight") else (draw(st.integers(1, 3)),)
              for n in names}
    if draw(st.booleans()):
        group = _options(draw, name, group=True)
        if table.get("momentum_schedule") is False:
            group.pop("momentum_decay", None)  # no schedule, no decay rate (a spec error otherwise)
        table["groups"] = [{"params": [draw(st.sampled_from(["a.*", "*.bias", "b.*"]))], **group}]
    if name == "muon":
        table["fallback"] = {"name": draw(st.sampled_from(["adamw", "adam", "sgd", "lion"])), "lr": 0.01}
        table.pop("groups", None)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    params = {n: rng.standard_normal(s) for n, s in shapes.items()}
    grads = [{n: rng.standard_normal(s) * 10 ** rng.uniform(-3, 1) for n, s in shapes.items() if rng.random() > 0.15}
             for _ in range(updates)]
    return spec_of(table), params, grads
