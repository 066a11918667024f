"""The oracle's schedules checked against mathematics, not against the twins: every closed form
(constant, step, multistep, exponential, cosine, linear, polynomial, cosine_restarts, warmup_cosine,
inverse_sqrt, wsd, cyclic, onecycle, and the momentum onecycle / cyclic cycle) evaluated here with
mpmath at 60 digits from torch's documented formulas (torch.optim.lr_scheduler) and optax's
(warmup_cosine_decay_schedule, the wsd shapes), at steps hypothesis draws toward the edges: the last
steps before a cosine's trough with periods up to 10⁶, linear and polynomial decays to 0, an anneal
to max_lr/(div·final_div), CyclicLR a million steps in. The bound is 1e-12 relative wherever the true
value is a normal float64 (inputs are floats taken exactly; the formulas are well conditioned in
them). Negative controls: the formulas as torch writes them ((1 + cos x)/2, 1 − s/n, start + (end −
start)·pct), which the oracle evaluated before, fail it; so does an error of one part in 10¹⁰."""

from __future__ import annotations

import math
from typing import Any

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config.schedule import ScheduleSpec
from conformance.oracle import schedules as oracle

REL = 1e-12
TINY = 2.2250738585072014e-308  # the smallest normal float64: below it values have absolute precision only
HUGE = 1.7976931348623157e308  # the largest float64
DIGITS = 60
LENGTHS = st.integers(1, 10 ** 6)
RATES = st.floats(1e-8, 10.0)


def half(x: Any) -> Any:
    """(1 + cos(π·x))/2."""
    return (1 + mp.cos(mp.pi * x)) / 2


def warm(spec: ScheduleSpec, b: Any, s: int) -> Any:
    """The linear warm-up b·(sf + (1 − sf)·s/W) of warmup_cosine, inverse_sqrt and wsd."""
    sf = mp.mpf(spec.start_factor)
    return b * (sf + (1 - sf) * mp.mpf(s) / spec.warmup_steps)


def bounded(spec: ScheduleSpec, factor: Any) -> Any:
    if spec.end_factor is None:
        return factor
    return max(factor, mp.mpf(spec.end_factor)) if spec.gamma < 1 else min(factor, mp.mpf(spec.end_factor))


def onecycle(spec: ScheduleSpec, peak: float, s: int, momentum: bool = False) -> Any:
    """torch's OneCycleLR: phases end at pct·T − 1 [, 2·pct·T − 2] and T − 1; anneal from start to end."""
    total, pct = spec.total_steps, mp.mpf(spec.pct_start)
    initial = mp.mpf(peak) / mp.mpf(spec.div_factor)
    low = initial / mp.mpf(spec.final_div_factor)
    hi, lo = mp.mpf(spec.max_momentum), mp.mpf(spec.base_momentum)
    first, second = pct * total - 1, 2 * pct * total - 2
    if spec.three_phase:
        phases = ([(first, hi, lo), (second, lo, hi), (total - 1, hi, hi)] if momentum else
                  [(first, initial, mp.mpf(peak)), (second, mp.mpf(peak), initial), (total - 1, initial, low)])
    else:
        phases = [(first, hi, lo), (total - 1, lo, hi)] if momentum else [(first, initial, mp.mpf(peak)),
                                                                         (total - 1, mp.mpf(peak), low)]
    begin = mp.mpf(0)
    for i, (end, start_value, end_value) in enumerate(phases):
        if s <= end or i == len(phases) - 1:
            x = (s - begin) / (end - begin)
            if spec.anneal_strategy == "cos":
                return end_value + (start_value - end_value) * half(x)
            return (end_value - start_value) * x + start_value
        begin = end
    raise AssertionError("unreachable")


def cyclic_height(spec: ScheduleSpec, s: int) -> Any:
    """torch's CyclicLR: h·g, the share of the amplitude at step s."""
    size = spec.step_size_up + spec.step_size_down
    cycle = mp.floor(1 + mp.mpf(s) / size)
    x = 1 + mp.mpf(s) / size - cycle
    ratio = mp.mpf(spec.step_size_up) / size
    h = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
    if spec.mode == "triangular":
        return h
    if spec.mode == "triangular2":
        return h / mp.mpf(2) ** (cycle - 1)
    return h * mp.mpf(spec.gamma) ** s


def exact(spec: ScheduleSpec, base: float, s: int) -> Any:
    """The lr at schedule step s of a group whose lr is `base`, from the formulas, at DIGITS digits."""
    b, name = mp.mpf(base), spec.name
    eta = mp.mpf(spec.eta_min or 0.0)
    if name == "constant":
        return b * mp.mpf(spec.factor) if spec.factor is not None and s < spec.total_iters else b
    if name == "step":
        return b * bounded(spec, mp.mpf(spec.gamma) ** (s // spec.step_size))
    if name == "multistep":
        return b * mp.mpf(spec.gamma) ** sum(m <= s for m in spec.milestones)
    if name == "exponential":
        return b * bounded(spec, mp.mpf(spec.gamma) ** s)
    if name == "cosine":
        return eta + (b - eta) * half(mp.mpf(s) / spec.t_max)
    if name == "linear":
        sf, ef, n = mp.mpf(spec.start_factor), mp.mpf(spec.end_factor), spec.total_iters
        return b * (sf + (ef - sf) * mp.mpf(min(s, n)) / n)
    if name == "polynomial":
        ef, n = mp.mpf(spec.end_factor), spec.total_iters
        return b * (ef + (1 - ef) * (1 - mp.mpf(min(s, n)) / n) ** mp.mpf(spec.power))
    if name == "cosine_restarts":
        start, length, i = 0, spec.t_0, 0
        while s >= start + length:
            start, length, i = start + length, length * spec.t_mult, i + 1
        return eta + (b - eta) * mp.mpf(spec.m_mul) ** i * half(mp.mpf(s - start) / length)
    w = spec.warmup_steps
    if name in ("warmup_cosine", "inverse_sqrt", "wsd") and s < w:
        return warm(spec, b, s)
    if name == "warmup_cosine":
        u = min(s, spec.total_steps) - w if spec.convention == "optax" else s - w
        return eta + (b - eta) * half(mp.mpf(u) / (spec.total_steps - w))
    if name == "inverse_sqrt":
        return b * mp.sqrt(mp.mpf(spec.timescale) / max(s - w + spec.timescale, 1))
    if name == "wsd":
        decay = spec.total_steps - spec.decay_steps
        if s < decay:
            return b
        p = min(mp.mpf(s - decay) / spec.decay_steps, 1)
        shape = {"linear": 1 - p, "cosine": half(p), "1-sqrt": 1 - mp.sqrt(p)}[spec.decay_type]
        return eta + (b - eta) * shape
    if name == "cyclic":
        return b + (mp.mpf(spec.max_lr) - b) * cyclic_height(spec, s)
    if name == "onecycle":
        return onecycle(spec, base, s)
    raise AssertionError(f"no closed form for {name}")


def close(got: float, want: Any, rel: float = REL) -> bool:
    if abs(want) > HUGE:  # beyond float64's range: the float value overflows
        return math.isinf(got)
    if abs(want) < TINY:  # not a normal float64: absolute precision only
        return abs(mp.mpf(got) - want) <= rel * TINY
    return abs(mp.mpf(got) - want) <= rel * abs(want)


def steps_near(length: int, data: Any, top: int) -> int:
    """A step hypothesis draws anywhere up to `top`, or within a few steps of `length` (an end or a trough)."""
    return data.draw(st.one_of(st.integers(0, top), st.integers(max(length - 3, 0), length + 3)))


def draw(name: str, data: Any) -> tuple[dict, float, int]:
    """A schedule of kind `name`, a base lr and a step, drawn toward the edges."""
    d, b = data.draw, data.draw(RATES)
    if name == "constant":
        n = d(st.integers(1, 1000))
        return {"factor": d(st.floats(1e-6, 1.0)), "total_iters": n}, b, steps_near(n, data, 2 * n)
    if name in ("step", "exponential"):
        gamma = d(st.one_of(st.floats(0.05, 0.9999999), st.floats(1.0000001, 1.5)))
        bound = st.floats(1e-6, 1.0) if gamma < 1 else st.floats(1.0, 1e6)  # a floor for a decay, a ceiling for a growth
        spec = {"gamma": gamma, "end_factor": d(st.one_of(st.none(), bound))}
        if name == "step":
            spec["step_size"] = d(st.integers(1, 1000))
        return spec, b, d(st.integers(0, 5000))
    if name == "multistep":
        marks = sorted(set(d(st.lists(st.integers(1, 10 ** 4), min_size=1, max_size=6))))
        return {"milestones": marks, "gamma": d(st.floats(1e-3, 2.0))}, b, d(st.integers(0, 2 * 10 ** 4))
    if name == "cosine":
        n = d(LENGTHS)
        return {"t_max": n, "eta_min": d(st.sampled_from([0.0, b * 1e-3, b]))}, b, steps_near(n, data, 3 * n)
    if name == "linear":
        n = d(LENGTHS)
        start, end = d(st.floats(1e-6, 3.0)), d(st.one_of(st.just(0.0), st.floats(1e-6, 3.0)))
        return {"start_factor": start, "end_factor": end, "total_iters": n}, b, steps_near(n, data, 2 * n)
    if name == "polynomial":
        n = d(LENGTHS)
        return ({"total_iters": n, "power": d(st.floats(0.1, 4.0)), "end_factor": d(st.sampled_from([0.0, 1e-4, 0.5]))},
                b, steps_near(n, data, 2 * n))
    if name == "cosine_restarts":
        t0, mult = d(st.integers(1, 10 ** 5)), d(st.integers(1, 3))
        return ({"t_0": t0, "t_mult": mult, "eta_min": d(st.sampled_from([0.0, b * 1e-3])), "m_mul": d(st.floats(0.1, 1.0))},
                b, steps_near(t0, data, 10 * t0))
    if name in ("warmup_cosine", "inverse_sqrt", "wsd"):
        w = d(st.integers(0, 10 ** 4))
        spec = {"warmup_steps": w, "start_factor": d(st.sampled_from([0.0, 1e-3, 0.5]))}
        if name == "inverse_sqrt":
            return ({**spec, "warmup_steps": max(w, 1), "timescale": d(st.integers(1, 10 ** 4))}, b,
                    steps_near(w, data, 10 ** 6))
        total = w + d(LENGTHS)
        spec.update(total_steps=total, eta_min=d(st.sampled_from([0.0, b * 1e-3])))
        if name == "warmup_cosine":
            spec["convention"] = d(st.sampled_from(["optax", "torch"]))
        else:
            spec.update(decay_steps=d(st.integers(1, total - w)), decay_type=d(st.sampled_from(["linear", "cosine", "1-sqrt"])))
        return spec, b, steps_near(d(st.sampled_from([w, total])), data, 2 * total)
    if name == "cyclic":
        up, down = d(st.integers(1, 5000)), d(st.integers(1, 5000))
        spec = {"max_lr": b * d(st.floats(1.5, 100.0)), "step_size_up": up, "step_size_down": down,
                "mode": d(st.sampled_from(["triangular", "triangular2", "exp_range"]))}
        if spec["mode"] == "exp_range":
            spec["gamma"] = d(st.floats(0.99999, 1.0))
        return spec, b, d(st.one_of(st.integers(0, 10 ** 6), st.integers(10 ** 6, 10 ** 6 + up + down)))
    total = d(st.integers(100, 10 ** 6))  # pct_start·total_steps > 1, as torch needs
    spec = {"max_lr": b, "total_steps": total, "pct_start": d(st.floats(0.05, 0.45)),
            "anneal_strategy": d(st.sampled_from(["cos", "linear"])), "div_factor": d(st.sampled_from([25.0, 1e4])),
            "final_div_factor": d(st.sampled_from([1e4, 1e8])), "three_phase": d(st.booleans())}
    return spec, b, steps_near(total - 1, data, total - 1)


def oracle_lr(spec: ScheduleSpec, b: float, s: int) -> float:
    with np.errstate(over="ignore"):  # a growth past float64's range is inf, as close() expects
        return float(oracle.lr_function(spec, b)(np.asarray([s], np.int64))[0])


CLOSED = ["constant", "step", "multistep", "exponential", "cosine", "linear", "polynomial", "cosine_restarts",
          "warmup_cosine", "inverse_sqrt", "wsd", "cyclic", "onecycle"]


@pytest.mark.parametrize("name", CLOSED)
@settings(max_examples=80, deadline=None, derandomize=True)
@given(data=st.data())
def test_every_closed_form_is_within_1e_12_of_the_mathematics(name: str, data: Any) -> None:
    fields, b, s = draw(name, data)
    spec = ScheduleSpec(name=name, **fields)
    with mp.workdps(DIGITS):
        want = exact(spec, b, s)
        got = oracle_lr(spec, b, s)
        assert close(got, want), f"{name} at s = {s}: {got!r} against {mp.nstr(want, 20)}"


@pytest.mark.parametrize("name", ["onecycle", "cyclic"])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_the_cycled_momentum_is_within_1e_12_of_the_mathematics(name: str, data: Any) -> None:
    fields, b, s = draw(name, data)
    spec = ScheduleSpec(name=name, **fields, base_momentum=0.85, max_momentum=data.draw(st.floats(0.86, 0.999)))
    with mp.workdps(DIGITS):
        if name == "onecycle":
            want = onecycle(spec, b, s, momentum=True)
        else:
            want = mp.mpf(spec.max_momentum) - (mp.mpf(spec.max_momentum) - mp.mpf(0.85)) * cyclic_height(spec, s)
        got = float(oracle.momentum_function(spec)(np.asarray([s], np.int64))[0])
        assert close(got, want), f"{name} momentum at s = {s}: {got!r} against {mp.nstr(want, 20)}"


# -- negative controls: the formulas as torch writes them, and a planted error, are flagged ----------

def _as_torch_writes_them(spec: ScheduleSpec, b: float, s: int) -> float:
    if spec.name == "cosine":
        return spec.eta_min + (b - spec.eta_min) * (1 + math.cos(math.pi * s / spec.t_max)) / 2
    if spec.name == "linear":
        return b * (spec.start_factor + (spec.end_factor - spec.start_factor) * min(s, spec.total_iters) / spec.total_iters)
    # OneCycleLR's _annealing_linear, (end − start)·pct + start, in its last phase
    end, low = spec.total_steps - 1, b / spec.div_factor / spec.final_div_factor
    first = float(spec.pct_start * spec.total_steps) - 1
    return (low - b) * ((s - first) / (end - first)) + b


@pytest.mark.parametrize("fields, s", [
    ({"name": "cosine", "t_max": 10 ** 6, "eta_min": 0.0}, 10 ** 6 - 1),  # 1 + cos(π(1 − 10⁻⁶)): 4 digits left
    ({"name": "linear", "start_factor": 1.0, "end_factor": 0.0, "total_iters": 10 ** 6}, 10 ** 6 - 1),
    ({"name": "onecycle", "max_lr": 0.1, "total_steps": 1000, "anneal_strategy": "linear"}, 999),  # the end: b/(25·10⁴)
])
def test_negative_control_the_formulas_as_torch_writes_them_are_flagged(fields: dict, s: int) -> None:
    spec = ScheduleSpec(**fields)
    with mp.workdps(DIGITS):
        want = exact(spec, 0.1, s)
        assert close(oracle_lr(spec, 0.1, s), want)
        assert not close(_as_torch_writes_them(spec, 0.1, s), want)


def test_negative_control_an_error_of_one_part_in_1e10_is_flagged() -> None:
    spec = ScheduleSpec(name="warmup_cosine", warmup_steps=10, total_steps=1000)
    with mp.workdps(DIGITS):
        want = exact(spec, 0.1, 500)
        got = oracle_lr(spec, 0.1, 500)
        assert close(got, want) and not close(got * (1 + 1e-10), want)


# -- S-CANCEL: what torch and optax compute there (docs/divergences.md) ----------------------------

def test_s_cancel_torch_and_optax_lose_digits_before_the_trough_within_an_ulp_of_the_base_lr() -> None:
    torch = pytest.importorskip("torch")
    optax = pytest.importorskip("optax")
    jax = pytest.importorskip("jax")
    b, n = 0.1, 1000
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=b)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n)
    for _ in range(n - 1):
        opt.step()
        sched.step()
    ulp = math.ulp(b)
    with mp.workdps(DIGITS):
        want = mp.mpf(b) * half(mp.mpf(n - 1) / n)
        torch_error = abs(mp.mpf(opt.param_groups[0]["lr"]) - want)
        assert torch_error > REL * want and torch_error <= 2 * ulp  # measured 9.5e-12 relative (2.4e-18 absolute)
        long = 10 ** 6
        want = mp.mpf(b) * half(mp.mpf(long - 1) / long)
        with jax.enable_x64(True):
            optax_value = float(optax.cosine_decay_schedule(b, long)(long - 1))
        optax_error = abs(mp.mpf(optax_value) - want)
        assert optax_error > 1e-7 * want and optax_error <= 2 * ulp  # measured 5.7e-6 relative in float64 (1.4e-18 absolute)
        assert close(oracle_lr(ScheduleSpec(name="cosine", t_max=long), b, long - 1), want)
