"""Schedule properties over random options: torch == jax == oracle (10^4 updates), bounds, monotone
stretches, endpoint values, continuity where the schedule is continuous, and milestone restarts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config import load_config
from conformance.config.schedule import SCHEDULE_NAMES
from conformance.harness.backends import Backend
from conformance.harness.compare import compare
from conformance.oracle.schedules import schedule_values as oracle_values
from conformance.rules.groups import group_base_lrs

ATOL, RTOL = 1e-12, 1e-10  # docs/contract.md §3 float64
# the schedules drawn here; chained, cyclic, reduce_on_plateau and optax's / Keras's extra fields:
# tests/test_schedules_peers.py
CLASSIC = [n for n in SCHEDULE_NAMES if n not in ("chained", "cyclic", "reduce_on_plateau")]
PARTS = [n for n in CLASSIC if n not in ("onecycle", "sequential")]


def _f(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


def _factor(zero: bool = True) -> st.SearchStrategy[float]:
    # 0 (warm-ups only) or >= 1e-100: smaller start factors are rejected (torch's LinearLR overflows)
    return (st.just(0.0) if zero else st.nothing()) | _f(1e-100, 1.0) | st.sampled_from([1e-10, 0.5, 1.0])


@st.composite
def tables(draw, name: str, length: int, low: float) -> dict:
    """A valid [schedule] table for `name` whose phases fit in about `length` steps; eta_min <= low."""
    n = st.integers
    eta = draw(st.sampled_from([0.0, low * 0.5, low]))
    if name == "constant":
        return draw(st.sampled_from([{"name": "constant"}, {"name": "constant", "factor": draw(_f(0.01, 1.0)),
                                                             "total_iters": draw(n(1, length))}]))
    if name == "step":
        return {"name": name, "step_size": draw(n(1, length)), "gamma": draw(_f(0.05, 1.0))}
    if name == "multistep":
        ms = sorted(draw(st.sets(n(1, 2 * length), min_size=1, max_size=5)))
        return {"name": name, "milestones": ms, "gamma": draw(_f(0.05, 1.0))}
    if name == "exponential":
        return {"name": name, "gamma": draw(_f(0.5, 1.0))}
    if name == "cosine":
        return {"name": name, "t_max": draw(n(1, length)), "eta_min": eta}
    if name == "linear":
        return {"name": name, "start_factor": draw(_factor(zero=False)), "end_factor": draw(_f(0.0, 1.0)),
                "total_iters": draw(n(1, length))}
    if name == "polynomial":
        return {"name": name, "total_iters": draw(n(1, length)), "power": draw(_f(0.0, 4.0))}
    if name == "onecycle":
        total = draw(n(max(4, length), 2 * max(4, length)))
        three = draw(st.booleans())
        hi = min(0.95, (total + 1) / (2 * total) - 1e-3) if three else 0.95
        return {"name": name, "total_steps": total, "pct_start": draw(_f(1.0 / total + 1e-3, hi)),
                "three_phase": three, "anneal_strategy": draw(st.sampled_from(["cos", "linear"])),
                "div_factor": draw(_f(1.5, 100.0)), "final_div_factor": draw(_f(1.5, 1e5)),
                "cycle_momentum": draw(st.booleans()), "base_momentum": draw(_f(0.5, 0.9)),
                "max_momentum": draw(_f(0.5, 0.99))}
    if name == "cosine_restarts":
        return {"name": name, "t_0": draw(n(1, length)), "t_mult": draw(n(1, 3)), "eta_min": eta}
    if name == "warmup_cosine":
        w = draw(n(0, length))
        return {"name": name, "warmup_steps": w, "total_steps": w + draw(n(1, length)), "eta_min": eta,
                "start_factor": draw(_factor()),
                "convention": draw(st.sampled_from(["optax", "torch"]))}
    if name == "inverse_sqrt":
        w = draw(n(0, length))
        extra = {"timescale": draw(n(1, length))} if w == 0 or draw(st.booleans()) else {}
        return {"name": name, "warmup_steps": w, "start_factor": draw(_factor()), **extra}
    if name == "wsd":
        w, d = draw(n(0, length)), draw(n(1, length))
        return {"name": name, "warmup_steps": w, "decay_steps": d, "total_steps": w + d + draw(n(0, length)),
                "start_factor": draw(_factor()), "eta_min": eta,
                "decay_type": draw(st.sampled_from(["linear", "cosine", "1-sqrt"]))}
    if name == "tabulated":
        return {"name": name, "factors": draw(st.lists(_f(0.0, 1.0), min_size=1, max_size=min(length, 60)))}
    k = draw(n(1, 3))
    cuts = sorted(draw(st.sets(n(1, 3 * length), min_size=k - 1, max_size=k - 1)))
    parts = [draw(tables(draw(st.sampled_from(PARTS)), length, low)) for _ in range(k)]
    return {"name": "sequential", "milestones": cuts, "schedulers": parts}


@st.composite
def configs(draw, name: str, length: int) -> object:
    lrs = draw(st.lists(st.sampled_from([0.0, 1e-4, 3e-4, 0.01, 0.1, 1.0]) | _f(1e-5, 2.0), min_size=1, max_size=3))
    if name == "onecycle":
        lrs = [x or 0.1 for x in lrs]
    table = draw(tables(name, length, min(lrs)))
    if draw(st.integers(0, 3)) == 0:
        table = {**table, "unit": "epoch"}
        for part in table.get("schedulers", []):
            part["unit"] = "epoch"
    optimizer = {"name": draw(st.sampled_from(["sgd", "adam"])), "lr": lrs[-1],
                 "groups": [{"params": [f"g{i}.*"], "lr": x} for i, x in enumerate(lrs[:-1])]}
    return load_config({"optimizer": optimizer, "schedule": table})


def _steps(cfg, want: int, upe: int) -> int:
    spec = cfg.schedule
    return min(want, spec.total_steps * upe) if spec.name == "onecycle" else want


def _agree(cfg, steps: int, upe: int, **kw) -> None:
    want = oracle_values(cfg.schedule, cfg.optimizer, steps, upe, **kw)
    for name in ("torch", "jax"):
        backend = Backend(name)
        with backend.context():
            got = backend.function("schedules", "schedule_values")(cfg.schedule, cfg.optimizer, steps, upe, **kw)
        for key in ("lr", "momentum"):
            if want[key] is None:
                assert got[key] is None
                continue
            result = compare(got[key], want[key], ATOL, RTOL)
            assert result.passed, f"{name} {key}: {result.message}"


@pytest.mark.parametrize("name", CLASSIC)
@settings(max_examples=3)
@given(data=st.data())
def test_backends_agree_over_ten_thousand_updates(name: str, data) -> None:
    cfg = data.draw(configs(name, 3000))
    upe = data.draw(st.integers(2, 7)) if cfg.schedule.unit == "epoch" else 1
    _agree(cfg, _steps(cfg, 10_000, upe), upe)


@pytest.mark.parametrize("name", CLASSIC)
@given(data=st.data())
def test_backends_agree_on_short_runs(name: str, data) -> None:
    cfg = data.draw(configs(name, 40))
    upe = data.draw(st.integers(2, 5)) if cfg.schedule.unit == "epoch" else 1
    _agree(cfg, _steps(cfg, 150, upe), upe)


# ---- properties of the closed form (the backends equal it, above) ----------------------------------


def _lr(cfg, steps: int) -> np.ndarray:
    return oracle_values(cfg.schedule, cfg.optimizer, steps)["lr"]


def _cfg(table: dict, lr: float = 0.1) -> object:
    return load_config({"optimizer": {"name": "sgd", "lr": lr}, "schedule": table})


@given(data=st.data(), name=st.sampled_from(CLASSIC))
def test_bounds(data, name: str) -> None:
    cfg = data.draw(configs(name, 30))
    s = cfg.schedule
    lr = oracle_values(s, cfg.optimizer, 120 if name != "onecycle" else s.total_steps)["lr"]
    base = np.array(group_base_lrs(cfg.optimizer))
    assert np.all(lr >= 0)
    # factors and gamma are <= 1 here: no schedule exceeds its group's lr (eta_min <= every lr)
    assert np.all(lr <= base * (1 + 1e-12) + 1e-15)


@given(t_max=st.integers(1, 50), eta=_f(0.0, 0.05), lr=_f(0.06, 1.0))
def test_cosine_endpoints_and_monotone_to_t_max(t_max: int, eta: float, lr: float) -> None:
    y = _lr(_cfg({"name": "cosine", "t_max": t_max, "eta_min": eta}, lr), 2 * t_max + 1)[:, 0]
    assert y[0] == pytest.approx(lr, rel=1e-15) and math.isclose(y[t_max], eta, abs_tol=1e-15)  # eta + (lr − eta): 1 ulp
    assert math.isclose(y[2 * t_max], lr, rel_tol=1e-12)  # torch's cosine climbs back past t_max
    assert np.all(np.diff(y[: t_max + 1]) <= 1e-15) and np.all(np.diff(y[t_max:]) >= -1e-15)


@given(name=st.sampled_from(["step", "multistep", "exponential", "polynomial"]), data=st.data())
def test_decays_are_monotone(name: str, data) -> None:
    cfg = data.draw(configs(name, 30))
    lr = oracle_values(cfg.schedule, cfg.optimizer, 100)["lr"]
    assert np.all(np.diff(lr, axis=0) <= 1e-15 * lr[:-1])


@given(w=st.integers(1, 30), d=st.integers(1, 40), sf=_factor(), eta=_f(0.0, 0.01), lr=_f(0.02, 1.0),
       convention=st.sampled_from(["optax", "torch"]))
def test_warmup_cosine_peak_endpoints_and_continuity(w, d, sf, eta, lr, convention) -> None:
    total = w + d
    cfg = _cfg({"name": "warmup_cosine", "warmup_steps": w, "total_steps": total, "start_factor": sf,
                "eta_min": eta, "convention": convention}, lr)
    y = _lr(cfg, total + 5)[:, 0]
    assert y[0] == pytest.approx(lr * sf, abs=1e-15) and y[w] == pytest.approx(lr, rel=1e-14)
    assert sf == 1.0 or np.all(y[:w] < lr)  # update warmup_steps is the first to apply the peak
    assert y[total] == pytest.approx(eta, abs=1e-15)
    assert np.all(np.diff(y[: w + 1]) >= -1e-15) and np.all(np.diff(y[w: total + 1]) <= 1e-15)
    slope = max(lr * (1 - sf) / w, (lr - eta) * math.pi / (2 * d))  # no jump at the peak
    assert np.all(np.abs(np.diff(y[: total + 1])) <= slope * (1 + 1e-9) + 1e-15)
    tail = y[total: total + d + 1]  # optax holds eta_min; torch's cosine climbs back for d updates
    assert np.all(tail == y[total]) if convention == "optax" else np.all(np.diff(tail) >= 0)


@given(w=st.integers(0, 20), stable=st.integers(0, 20), d=st.integers(1, 30), sf=_factor(),
       eta=_f(0.0, 0.01), lr=_f(0.02, 1.0), kind=st.sampled_from(["linear", "cosine", "1-sqrt"]))
def test_wsd_phases(w, stable, d, sf, eta, lr, kind) -> None:
    total = w + stable + d
    cfg = _cfg({"name": "wsd", "warmup_steps": w, "decay_steps": d, "total_steps": total, "start_factor": sf,
                "eta_min": eta, "decay_type": kind}, lr)
    y = _lr(cfg, total + 3)[:, 0]
    np.testing.assert_allclose(y[w: total - d + 1], lr, rtol=1e-15)  # stable; the decay starts from lr
    assert np.all(np.diff(y[w:]) <= 1e-15) and np.all(y[total:] == pytest.approx(eta, abs=1e-15))
    steepest = {"linear": 1 / d, "cosine": math.pi / (2 * d), "1-sqrt": 1 / math.sqrt(d)}[kind]
    slope = max(lr * (1 - sf) / w if w else 0.0, (lr - eta) * steepest)
    assert np.all(np.abs(np.diff(y[: total + 1])) <= slope * (1 + 1e-9) + 1e-15)


@given(data=st.data())
def test_onecycle_shape(data) -> None:
    cfg = data.draw(configs("onecycle", 40))
    s = cfg.schedule
    out = oracle_values(s, cfg.optimizer, s.total_steps)
    y, peak = out["lr"][:, -1], cfg.optimizer.lr
    assert y[0] == pytest.approx(peak / s.div_factor, rel=1e-12)
    assert y[-1] == pytest.approx(peak / s.div_factor / s.final_div_factor, rel=1e-9, abs=1e-18)
    top = int(np.argmax(y))
    assert top in (math.floor(s.pct_start * s.total_steps - 1), math.ceil(s.pct_start * s.total_steps - 1))
    assert np.all(np.diff(y[: top + 1]) >= -1e-15)
    if not s.three_phase:
        assert np.all(np.diff(y[top:]) <= 1e-15)
    if out["momentum"] is not None:  # momentum moves opposite to the lr in the first phase
        m = out["momentum"][:, -1]
        assert m[0] == s.max_momentum and np.all(np.diff(m[: top + 1]) * np.sign(s.max_momentum - s.base_momentum) <= 1e-15)


@given(t0=st.integers(1, 10), mult=st.integers(1, 3), eta=_f(0.0, 0.01), lr=_f(0.02, 1.0))
def test_restarts_return_to_the_base_lr(t0, mult, eta, lr) -> None:
    y = _lr(_cfg({"name": "cosine_restarts", "t_0": t0, "t_mult": mult, "eta_min": eta}, lr), 200)[:, 0]
    start, length = 0, t0
    while start < 200:
        assert y[start] == pytest.approx(lr, rel=1e-14)
        assert np.all(np.diff(y[start: min(start + length, 200)]) <= 1e-15)
        assert np.all(y[start: start + length] > eta - 1e-15)  # eta_min itself is never applied
        start, length = start + length, length * mult


@given(data=st.data())
def test_sequential_parts_restart_at_their_milestones(data) -> None:
    cfg = data.draw(configs("sequential", 20))
    s = cfg.schedule
    steps = (s.milestones[-1] if s.milestones else 0) + 30
    whole = _lr(cfg, steps)
    bounds = [0, *s.milestones, steps]
    for i, part in enumerate(s.schedulers):
        alone = oracle_values(part, cfg.optimizer, bounds[i + 1] - bounds[i])["lr"]
        np.testing.assert_array_equal(whole[bounds[i]: bounds[i + 1]], alone)
