"""chained, cyclic, reduce_on_plateau, Keras's m_mul, optax's end values and starts above the peak:
torch == jax == oracle over random hyper-parameters (hypothesis, the small `ci` profile), and the
properties that define each; CyclicLR's momentum cycling end to end against torch.optim."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config import load_config
from conformance.harness.backends import Backend
from conformance.harness.compare import compare
from conformance.oracle.schedules import schedule_values as oracle_values
from conformance.rules.groups import group_base_lrs
from ref_jax._schedules import build_scheduler

ATOL, RTOL = 1e-12, 1e-10  # docs/contract.md §3 float64
n = st.integers


def _f(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


@st.composite
def chainable(draw, length: int) -> dict:
    """A part torch's ChainedScheduler multiplies (cosine: t_max past the run)."""
    kind = draw(st.sampled_from(["constant", "step", "multistep", "exponential", "cosine", "linear", "polynomial"]))
    if kind == "constant":
        return {"name": kind, "factor": draw(_f(0.01, 1.0)), "total_iters": draw(n(1, length))}
    if kind == "step":
        return {"name": kind, "step_size": draw(n(1, length)), "gamma": draw(_f(0.1, 1.0))}
    if kind == "multistep":
        return {"name": kind, "milestones": sorted(draw(st.sets(n(1, length), min_size=1, max_size=3))),
                "gamma": draw(_f(0.1, 1.0))}
    if kind == "exponential":
        return {"name": kind, "gamma": draw(_f(0.8, 1.0))}
    if kind == "cosine":
        return {"name": kind, "t_max": draw(n(length, 3 * length))}
    if kind == "linear":
        return {"name": kind, "start_factor": draw(_f(0.01, 1.0)), "end_factor": draw(_f(0.0, 1.0)),
                "total_iters": draw(n(1, length))}
    return {"name": kind, "total_iters": draw(n(1, length)), "power": draw(_f(0.0, 3.0))}


@st.composite
def peer_configs(draw, name: str, length: int) -> tuple:
    """(config, keyword arguments of schedule_values) for a schedule the peers define."""
    lrs = draw(st.lists(_f(1e-4, 1.0), min_size=1, max_size=3))
    kw: dict = {}
    opt = draw(st.sampled_from(["sgd", "adam", "rmsprop"]))
    if name == "chained":
        table = {"name": name, "schedulers": draw(st.lists(chainable(length), min_size=1, max_size=3))}
    elif name == "cyclic":
        mode = draw(st.sampled_from(["triangular", "triangular2", "exp_range"]))
        table = {"name": name, "max_lr": draw(_f(1e-3, 2.0)), "step_size_up": draw(n(1, length)),
                 "step_size_down": draw(n(1, length)), "mode": mode, "cycle_momentum": draw(st.booleans()),
                 "base_momentum": draw(_f(0.5, 0.9)), "max_momentum": draw(_f(0.5, 0.99))}
        if mode == "exp_range":
            table["gamma"] = draw(_f(0.9, 1.0))
        if draw(st.booleans()):
            table["base_lr"], lrs = draw(_f(0.0, 0.5)), lrs[-1:]  # base_lr overrides every group's lr
    elif name == "reduce_on_plateau":
        rel = draw(st.booleans())
        table = {"name": name, "mode": draw(st.sampled_from(["min", "max"])), "factor": draw(_f(0.05, 0.95)),
                 "patience": draw(n(0, 4)), "threshold": draw(_f(0.0, 0.1 if rel else 0.05)),
                 "threshold_mode": "rel" if rel else "abs", "cooldown": draw(n(0, 3)),
                 "min_lr": draw(st.sampled_from([0.0, 1e-4, 1e-2])), "eps": draw(st.sampled_from([0.0, 1e-8, 1e-3]))}
        steps = draw(n(2, 4 * length))
        walk = np.cumsum(draw(st.lists(_f(-0.1, 0.1), min_size=steps, max_size=steps)))
        plateaus = draw(st.lists(st.booleans(), min_size=steps, max_size=steps))
        metrics = [float(x) if not p else 0.0 for x, p in zip(walk, plateaus)]
        if draw(st.booleans()):
            metrics[draw(n(0, steps - 1))] = math.nan
        kw["metrics"] = metrics
    elif name == "cosine_restarts":
        table = {"name": name, "t_0": draw(n(1, length)), "t_mult": draw(n(1, 3)), "m_mul": draw(_f(0.1, 2.0)),
                 "eta_min": draw(st.sampled_from([0.0, min(lrs) / 2]))}
    else:  # optax's end values and starts above the peak
        kind = draw(st.sampled_from(["polynomial", "exponential", "step", "linear", "warmup_cosine"]))
        if kind == "polynomial":
            table = {"name": kind, "total_iters": draw(n(1, length)), "power": draw(_f(0.0, 3.0)),
                     "end_factor": draw(_f(0.0, 3.0))}
        elif kind in ("exponential", "step"):
            down = draw(st.booleans())
            gamma = draw(_f(0.5, 0.99) if down else _f(1.01, 1.5))
            table = {"name": kind, "gamma": gamma, "end_factor": draw(_f(0.0, 1.0) if down else _f(1.0, 10.0))}
            if kind == "step":
                table["step_size"] = draw(n(1, length))
        elif kind == "linear":
            table = {"name": kind, "start_factor": draw(_f(0.01, 5.0)), "end_factor": draw(_f(0.0, 5.0)),
                     "total_iters": draw(n(1, length))}
        else:
            w = draw(n(1, length))
            table = {"name": kind, "warmup_steps": w, "total_steps": w + draw(n(1, length)),
                     "start_factor": draw(_f(1.0, 5.0)), "convention": draw(st.sampled_from(["optax", "torch"]))}
    optimizer = {"name": opt, "lr": lrs[-1], "groups": [{"params": [f"g{i}.*"], "lr": x} for i, x in enumerate(lrs[:-1])]}
    return load_config({"optimizer": optimizer, "schedule": table}), kw


def _steps(cfg, kw: dict, length: int) -> int:
    if "metrics" in kw:
        return len(kw["metrics"])
    if cfg.schedule.name == "chained":  # a chained cosine may not pass its t_max
        return min([length * 3] + [p.t_max + 1 for p in cfg.schedule.schedulers if p.name == "cosine"])
    return length * 3


def agree(cfg, steps: int, **kw) -> None:
    want = oracle_values(cfg.schedule, cfg.optimizer, steps, **kw)
    for name in ("torch", "jax"):
        backend = Backend(name)
        with backend.context():
            got = backend.function("schedules", "schedule_values")(cfg.schedule, cfg.optimizer, steps, **kw)
        for key in ("lr", "momentum"):
            if want[key] is None:
                assert got[key] is None, f"{name} {key}"
                continue
            result = compare(got[key], want[key], ATOL, RTOL)
            assert result.passed, f"{name} {key}: {result.message}"


@pytest.mark.parametrize("name", ["chained", "cyclic", "reduce_on_plateau", "cosine_restarts", "optax"])
@settings(max_examples=10)
@given(data=st.data())
def test_backends_agree(name: str, data) -> None:
    cfg, kw = data.draw(peer_configs(name, 30))
    agree(cfg, _steps(cfg, kw, 30), **kw)


@settings(max_examples=5)
@given(data=st.data())
def test_backends_agree_on_spots_of_long_runs(data) -> None:
    cfg, _ = data.draw(peer_configs(data.draw(st.sampled_from(["cyclic", "cosine_restarts", "optax"])), 2000))
    at = sorted(data.draw(st.sets(n(0, 19_999), min_size=1, max_size=8)))
    agree(cfg, 20_000, at=at)


# ---- the properties of each (the backends equal the oracle, above) ------------------------------


@given(data=st.data())
def test_chained_is_the_product_of_its_parts(data) -> None:
    cfg, _ = data.draw(peer_configs("chained", 20))
    steps = _steps(cfg, {}, 20)
    whole = oracle_values(cfg.schedule, cfg.optimizer, steps)["lr"]
    base = np.array(group_base_lrs(cfg.optimizer))
    product = np.ones_like(whole)
    for part in cfg.schedule.schedulers:
        product *= oracle_values(part, cfg.optimizer, steps)["lr"] / base
    np.testing.assert_allclose(whole, product * base, rtol=1e-12, atol=1e-300)


@given(data=st.data())
def test_cyclic_triangles(data) -> None:
    cfg, _ = data.draw(peer_configs("cyclic", 10))
    s = cfg.schedule
    out = oracle_values(s, cfg.optimizer, 10 * (s.step_size_up + s.step_size_down))
    lr, a = out["lr"], (np.full(1, s.base_lr) if s.base_lr is not None else np.array(group_base_lrs(cfg.optimizer)))
    period = s.step_size_up + s.step_size_down
    np.testing.assert_allclose(lr[::period], np.broadcast_to(a, lr[::period].shape), rtol=1e-12)  # cycle starts
    lo, hi = np.minimum(a, s.max_lr), np.maximum(a, s.max_lr)
    assert np.all(lr >= lo - 1e-12) and np.all(lr <= hi + 1e-12)
    peaks = lr[s.step_size_up::period]
    scale = {"triangular": np.ones(len(peaks)), "triangular2": 0.5 ** np.arange(len(peaks)),
             "exp_range": s.gamma ** (s.step_size_up + period * np.arange(len(peaks)))}[s.mode]
    np.testing.assert_allclose(peaks, a + (s.max_lr - a) * scale[:, None], rtol=1e-9, atol=1e-15)
    if out["momentum"] is not None:  # momentum moves against the lr, over the same fraction
        m = out["momentum"][:, -1]
        if s.max_lr != a[-1]:
            np.testing.assert_allclose((s.max_momentum - m) * (s.max_lr - a[-1]),
                                       (lr[:, -1] - a[-1]) * (s.max_momentum - s.base_momentum), atol=1e-12)


@given(data=st.data())
def test_plateau_reductions_follow_patience_and_cooldown(data) -> None:
    cfg, kw = data.draw(peer_configs("reduce_on_plateau", 15))
    s = cfg.schedule
    lr = oracle_values(s, cfg.optimizer, len(kw["metrics"]), metrics=kw["metrics"])["lr"]
    base = np.array(group_base_lrs(cfg.optimizer))
    assert np.all(np.diff(lr, axis=0) <= 0)  # never up
    assert np.all(lr >= np.minimum(base, s.min_lr))
    changed = np.flatnonzero(np.any(np.diff(lr, axis=0) != 0, axis=1)) + 1  # rows whose lr fell
    if changed.size:
        assert changed[0] >= s.patience + 1  # patience + 1 bad observations first (optax: patience)
        assert np.all(np.diff(changed) >= s.patience + 1 + s.cooldown)


@given(t0=n(1, 8), mult=n(1, 3), m=_f(0.1, 2.0), eta=_f(0.0, 0.01), lr=_f(0.02, 1.0))
def test_each_restart_peaks_at_m_mul_times_the_last(t0, mult, m, eta, lr) -> None:
    cfg = load_config({"optimizer": {"name": "sgd", "lr": lr},
                       "schedule": {"name": "cosine_restarts", "t_0": t0, "t_mult": mult, "m_mul": m, "eta_min": eta}})
    y = oracle_values(cfg.schedule, cfg.optimizer, 300)["lr"][:, 0]
    start, length, i = 0, t0, 0
    while start < 300:
        assert y[start] == pytest.approx(eta + (lr - eta) * m ** i, rel=1e-12)
        start, length, i = start + length, length * mult, i + 1


@given(data=st.data())
def test_end_values_are_reached_and_held(data) -> None:
    cfg, _ = data.draw(peer_configs("optax", 20))
    s = cfg.schedule
    lr = oracle_values(s, cfg.optimizer, 200)["lr"]
    base = np.array(group_base_lrs(cfg.optimizer))
    if s.name == "polynomial" and s.power == 0:
        assert np.all(lr == base)  # 0^0 = 1: the lr holds (torch's PolynomialLR and optax alike)
    elif s.name in ("polynomial", "linear"):
        scale = base.max() * max(1.0, s.start_factor or 1.0)  # sf + (ef − sf) cancels to ~1 ulp of sf
        np.testing.assert_allclose(lr[s.total_iters:], np.broadcast_to(base * s.end_factor, lr[s.total_iters:].shape),
                                   rtol=1e-12, atol=1e-15 * scale)
    elif s.name in ("exponential", "step"):
        bound = base * s.end_factor
        assert np.all(lr >= bound * (1 - 1e-12)) if s.gamma < 1 else np.all(lr <= bound * (1 + 1e-12))
    else:  # a warm-up from above comes down to the peak at warmup_steps
        assert np.all(np.diff(lr[: s.warmup_steps + 1], axis=0) <= 1e-15)
        np.testing.assert_allclose(lr[s.warmup_steps], base, rtol=1e-12)


def _grad(p: np.ndarray) -> np.ndarray:
    return np.array([2.0, 0.5, -1.0]) * (p - np.array([1.0, -2.0, 0.5]))


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_cyclic_momentum_cycling_end_to_end(opt_name: str) -> None:
    """torch.optim.SGD / Adam under CyclicLR(cycle_momentum) == optax.inject_hyperparams(optax.sgd /
    optax.adam) driven by twinstep's JAX schedules (lr and momentum / b1), in float64."""
    cfg = load_config({"optimizer": {"name": opt_name, "lr": 0.05},
                       "schedule": {"name": "cyclic", "base_lr": 0.01, "max_lr": 0.1, "step_size_up": 3,
                                    "step_size_down": 4, "mode": "triangular2"}})
    p0, steps = np.array([0.3, 0.7, -1.2]), 20
    param = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float64))
    topt = torch.optim.SGD([param], lr=0.05, momentum=0.9) if opt_name == "sgd" else torch.optim.Adam([param], lr=0.05)
    tsched = torch.optim.lr_scheduler.CyclicLR(topt, 0.01, 0.1, 3, 4, mode="triangular2")
    torch_path = []
    for _ in range(steps):
        param.grad = torch.tensor(_grad(param.detach().numpy()), dtype=torch.float64)
        topt.step()
        tsched.step()
        torch_path.append(param.detach().numpy().copy())
    with jax.enable_x64(True):
        built = build_scheduler(cfg.schedule, group_base_lrs(cfg.optimizer))
        hyper = {"momentum": built.momentum[0]} if opt_name == "sgd" else {"b1": built.momentum[0]}
        tx = optax.inject_hyperparams(getattr(optax, opt_name))(learning_rate=built.lr[0], **hyper)
        p = jnp.asarray(p0)
        state, jax_path = tx.init(p), []
        for _ in range(steps):
            updates, state = tx.update(jnp.asarray(_grad(np.asarray(p))), state, p)
            p = optax.apply_updates(p, updates)
            jax_path.append(np.asarray(p))
    np.testing.assert_allclose(np.array(jax_path), np.array(torch_path), rtol=1e-10, atol=1e-12)
