"""The oracle's optimizers checked against mathematics, not against the twins: on a constant gradient
g every optimizer below has its state in closed form (m_t = (1 − β1ᵗ)·g, v_t = (1 − β2ᵗ)·g², Adagrad's
S_t = S_0 + t·g², SGD's buffer g·(μᵗ⁻¹ + (1 − dampening)·(1 − μᵗ⁻¹)/(1 − μ)), Lion's sign(g), Adamax's
u_t = |g| + ε), so each update's step δ_t is a closed form too (Adam: lr·g/(|g| + ε) whatever t), and
p_t = c·p_(t−1) − δ_t with c = 1 − lr·wd for decoupled decay. Both are evaluated here with mpmath at
60 digits from torch.optim's documented algorithms (optax's and Keras's variants where the spec
names them), and compared with the oracle's `run_trajectory` after T updates, at hyper-parameters
hypothesis draws toward the edges: β up to 1 − 10⁻⁷ (where 1 − βᵗ as written keeps 7 digits fewer), ε from
10⁻¹² to 10⁻³ against gradients from 10⁻⁸⁰ to 10⁸⁰, long runs.

The bound: |got − want| ≤ 1e-12·|want| + (16 + T)·u·scale, u = 2⁻⁵³ and scale = |p_0| + Σ|δ_t|: each
update rounds its step to a few ulps of δ_t and the new parameter to one ulp of p_t (≤ scale), and no
float64 evaluation of p_(t−1) − δ_t keeps more. A step that is wrong by one part in 10¹⁰ (the
negative control) is outside it."""

from __future__ import annotations

from typing import Any

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.config.optimizer import OptimizerSpec
from conformance.oracle.optimizers import run_trajectory

DIGITS = 60
U = 2.0 ** -53
REL = 1e-12
BETAS = st.one_of(st.floats(0.5, 0.99999), st.sampled_from([0.9, 0.999, 0.99999]),
                  st.builds(lambda m, k: 1 - m * 10.0 ** -k, st.floats(1.0, 9.99), st.integers(1, 7)))  # 1 − β small
EPS = st.one_of(st.floats(1e-12, 1e-3), st.just(1e-8))


def magnitudes() -> st.SearchStrategy[float]:
    return st.builds(lambda m, e, s: s * m * 10.0 ** e, st.floats(1.0, 9.99), st.integers(-80, 80), st.sampled_from([1, -1]))


def one_minus_pow(beta: float, t: int) -> Any:
    return 1 - mp.mpf(beta) ** t


def rectification(rho: Any, rho_inf: Any) -> Any:
    """RAdam's r_t (torch.optim.RAdam), used where ρ_t > 5."""
    return mp.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))


def steps(name: str, hp: dict, g: float, n: int, size: int) -> list[Any]:
    """δ_1 .. δ_n of one entry whose gradient is g at every update, from the closed forms."""
    lr, gm, a = mp.mpf(hp["lr"]), mp.mpf(g), abs(mp.mpf(g))
    out, buf, prod = [], mp.mpf(0), mp.mpf(1)
    for t in range(1, n + 1):
        if name == "sgd":
            mu = mp.mpf(hp.get("momentum", 0.0))
            if mu == 0:
                d = gm
            else:
                b = gm * (mu ** (t - 1) + (1 - mp.mpf(hp.get("dampening", 0.0))) * (1 - mu ** (t - 1)) / (1 - mu))
                d = gm + mu * b if hp.get("nesterov") else b
            out.append(lr * d)
        elif name in ("adam", "adamw"):
            b2, eps = hp["betas"][1], mp.mpf(hp["eps"])
            bc2 = one_minus_pow(b2, t)
            if hp.get("eps_hat"):  # Keras: lr·√(1 − β2ᵗ)/(1 − β1ᵗ)·m/(√v + ε)
                out.append(lr * mp.sqrt(bc2) * gm / (mp.sqrt(bc2) * a + eps))
            elif hp.get("amsgrad") and hp.get("amsgrad_variant") == "optax_raw":  # v̂ = max of the raw v
                out.append(lr * gm / (mp.sqrt(bc2) * a + eps))
            else:  # m̂ = g, v̂ = g² (amsgrad's maximum of an increasing v is v)
                out.append(lr * gm / (a + eps))
        elif name == "adamax":
            out.append(lr * gm / (a + mp.mpf(hp["eps"])))
        elif name == "nadam":
            b1, b2, eps = mp.mpf(hp["betas"][0]), hp["betas"][1], mp.mpf(hp["eps"])
            psi = mp.mpf(hp["momentum_decay"])
            mu = [b1 * (1 - mp.mpf(0.5) * mp.mpf(0.96) ** (k * psi)) for k in (t, t + 1)]
            prod *= mu[0]  # Π_(k ≤ t) μ_k
            m = (1 - b1 ** t) * gm
            out.append(lr * (1 - mu[0]) / (1 - prod) * gm / (a + eps) + lr * mu[1] / (1 - prod * mu[1]) * m / (a + eps))
        elif name == "radam":
            b2, eps = mp.mpf(hp["betas"][1]), mp.mpf(hp["eps"])
            bc2 = 1 - b2 ** t
            rho_inf = 2 / (1 - b2) - 1
            rho = rho_inf - 2 * t * b2 ** t / bc2
            if rho > 5:
                rect = rectification(rho, rho_inf)
                out.append(lr * gm * rect * mp.sqrt(bc2) / (mp.sqrt(bc2) * a + eps))
            else:
                out.append(lr * gm)
        elif name == "rmsprop":
            alpha, eps = mp.mpf(hp["alpha"]), mp.mpf(hp["eps"])
            v = (1 - alpha ** t) * gm ** 2
            denom = mp.sqrt(v + eps) if hp.get("eps_in_sqrt") else mp.sqrt(v) + eps
            mu = mp.mpf(hp.get("momentum", 0.0))
            buf = mu * buf + gm / denom
            out.append(lr * (buf if mu > 0 else gm / denom))
        elif name == "adagrad":
            total = mp.mpf(hp.get("initial_accumulator_value", 0.0)) + t * gm ** 2
            clr = lr / (1 + (t - 1) * mp.mpf(hp.get("lr_decay", 0.0)))
            out.append(clr * gm / (mp.sqrt(total) + mp.mpf(hp["eps"])))
        elif name == "lion":
            sign = mp.sign(gm)
            out.append(lr * sign * (mp.mpf(size) / (size + 1) if hp.get("cautious") else 1))
        else:
            raise AssertionError(name)
    return out


def draw(name: str, data: Any) -> dict:
    d = data.draw
    hp: dict = {"lr": d(st.floats(1e-6, 1.0))}
    if name == "sgd":
        mu = d(st.sampled_from([0.0, 0.5, 0.9, 0.99]))
        hp["momentum"] = mu
        if mu > 0:
            nesterov = d(st.booleans())
            hp.update(nesterov=nesterov, dampening=0.0 if nesterov else d(st.sampled_from([0.0, 0.1, 0.9])))
    elif name in ("adam", "adamw", "adamax", "nadam", "radam"):
        hp.update(betas=(d(BETAS), d(BETAS)), eps=d(EPS))
        if name == "adamw":
            hp["weight_decay"] = d(st.sampled_from([0.0, 0.01, 0.1]))
        if name in ("adam", "adamw"):
            kind = d(st.sampled_from(["plain", "amsgrad-torch", "amsgrad-optax", "amsgrad-optax_raw", "eps_hat"]))
            if kind == "eps_hat":
                hp["eps_hat"] = True
            elif kind != "plain":
                hp.update(amsgrad=True, amsgrad_variant=kind.split("-")[1])
        if name == "adamax":
            hp["eps_hat"] = d(st.booleans())
        if name == "nadam":
            hp["momentum_decay"] = d(st.sampled_from([0.004, 0.04, 0.4]))
    elif name == "rmsprop":
        hp.update(alpha=d(BETAS), eps=d(EPS), eps_in_sqrt=d(st.booleans()), momentum=d(st.sampled_from([0.0, 0.9])))
    elif name == "adagrad":
        hp.update(eps=d(EPS), lr_decay=d(st.sampled_from([0.0, 0.01, 1.0])),
                  initial_accumulator_value=d(st.sampled_from([0.0, 0.1, 1e3])))
    elif name == "lion":
        hp.update(betas=(d(BETAS), d(BETAS)), weight_decay=d(st.sampled_from([0.0, 0.1, 1.0])), cautious=d(st.booleans()))
    return hp


def worst_excess(name: str, hp: dict, p0: np.ndarray, g: np.ndarray, n: int, planted: float = 0.0) -> float:
    """max over entries of |got − want| / bound (≤ 1 passes); `planted` scales every exact step by 1 + planted."""
    got = run_trajectory(OptimizerSpec(name=name, **hp), {"w": p0}, grads=[{"w": g}] * n)["params"][-1]["w"]
    c = 1 - mp.mpf(hp["lr"]) * mp.mpf(hp.get("weight_decay", 0.0)) if name in ("adamw", "lion") else mp.mpf(1)
    out = 0.0
    for i in range(g.size):
        deltas = [d * (1 + mp.mpf(planted)) for d in steps(name, hp, float(g[i]), n, g.size)]
        want = mp.mpf(float(p0[i]))
        for d in deltas:
            want = c * want - d
        scale = abs(mp.mpf(float(p0[i]))) + mp.fsum(abs(d) for d in deltas)
        bound = REL * abs(want) + (16 + n) * U * scale
        out = max(out, float(abs(mp.mpf(float(got[i])) - want) / bound))
    return out


CLOSED = ["sgd", "adam", "adamw", "adamax", "nadam", "radam", "rmsprop", "adagrad", "lion"]


@pytest.mark.parametrize("name", CLOSED)
@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_every_closed_form_on_a_constant_gradient_is_within_the_bound(name: str, data: Any) -> None:
    hp = draw(name, data)
    size = data.draw(st.integers(1, 4))
    g = np.array(data.draw(st.lists(magnitudes(), min_size=size, max_size=size)))
    p0 = np.array(data.draw(st.lists(st.one_of(st.just(0.0), magnitudes()), min_size=size, max_size=size)))
    n = data.draw(st.one_of(st.integers(1, 5), st.integers(1, 300)))
    with mp.workdps(DIGITS):
        excess = worst_excess(name, hp, p0, g, n)
    assert excess <= 1.0, f"{name} {hp} after {n} updates: {excess:.3g} times the bound"


@pytest.mark.parametrize("name, hp", [
    ("sgd", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}),
    ("adam", {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}),
    ("rmsprop", {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "momentum": 0.9}),
    ("adagrad", {"lr": 0.1, "eps": 1e-10, "lr_decay": 0.01}),
])
def test_negative_control_a_step_wrong_by_one_part_in_1e10_is_outside_the_bound(name: str, hp: dict) -> None:
    g, p0 = np.array([0.3, -2.0, 1e-5]), np.zeros(3)
    with mp.workdps(DIGITS):
        assert worst_excess(name, hp, p0, g, 7) <= 1.0
        assert worst_excess(name, hp, p0, g, 7, planted=1e-10) > 10.0


@settings(max_examples=80, deadline=None, derandomize=True)
@given(b1=BETAS, b2=BETAS, eps=EPS, start=st.integers(5, 10 ** 4), n=st.integers(1, 20),
       g=st.lists(magnitudes(), min_size=1, max_size=3))
def test_radams_rectified_steps_from_a_late_state_are_within_the_bound(b1: float, b2: float, eps: float, start: int,
                                                                       n: int, g: list[float]) -> None:
    # from update `start` on, so that the unrectified steps lr·m̂ of the first updates are not in the scale
    hp = {"lr": 1e-3, "betas": (b1, b2), "eps": eps}
    grad = np.array(g)
    m0, v0 = (1 - b1 ** start) * grad, (1 - b2 ** start) * grad * grad
    state = {"w": {"step": np.asarray(start), "m": m0, "v": v0}}
    got = run_trajectory(OptimizerSpec(name="radam", **hp), {"w": np.zeros(grad.size)}, grads=[{"w": grad}] * n,
                         state=state)["params"][-1]["w"]
    with mp.workdps(DIGITS):
        B1, B2, lr = mp.mpf(b1), mp.mpf(b2), mp.mpf(hp["lr"])
        rho_inf = 2 / (1 - B2) - 1
        for i, gi in enumerate(g):
            m, v, want, scale = mp.mpf(float(m0[i])), mp.mpf(float(v0[i])), mp.mpf(0), mp.mpf(0)
            for t in range(start + 1, start + n + 1):
                m, v = B1 * m + (1 - B1) * gi, B2 * v + (1 - B2) * mp.mpf(gi) ** 2
                bc2 = 1 - B2 ** t
                rho = rho_inf - 2 * t * B2 ** t / bc2
                m_hat = m / (1 - B1 ** t)
                if rho > 5:
                    rect = rectification(rho, rho_inf)
                    d = lr * m_hat * rect * mp.sqrt(bc2) / (mp.sqrt(v) + mp.mpf(eps))
                else:
                    d = lr * m_hat
                want, scale = want - d, scale + abs(d)
            bound = REL * abs(want) + (16 + n) * U * scale
            assert abs(mp.mpf(float(got[i])) - want) <= bound, f"radam from update {start}, β2 = {b2}: {float(got[i])!r} against {mp.nstr(want, 20)}"


# -- O-CANCEL: what torch computes there (docs/divergences.md) -------------------------------------

def test_o_cancel_torchs_radam_and_adam_lose_digits_with_beta_near_1() -> None:
    torch = pytest.importorskip("torch")

    def torch_run(cls: Any, n: int, **kw: Any) -> list[float]:
        p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        opt = cls([p], lr=1e-3, eps=1e-8, **kw)
        out = []
        for _ in range(n):
            p.grad = torch.ones(1, dtype=torch.float64)
            opt.step()
            out.append(p.item())
        return out

    with mp.workdps(DIGITS):
        # RAdam, β2 = 0.99999: the 6th update is the first rectified; ρ_6 = ρ∞ − 12·β2⁶/(1 − β2⁶) ≈ 6 against ρ∞ ≈ 2e5
        hp = {"lr": 1e-3, "betas": (0.9, 0.99999), "eps": 1e-8}
        want = steps("radam", hp, 1.0, 6, 1)[-1]
        got_torch = torch_run(torch.optim.RAdam, 6, betas=hp["betas"])
        torch_error = abs((mp.mpf(got_torch[5]) - mp.mpf(got_torch[4]) + want) / want)
        assert torch_error > 1e-9  # measured 2.8e-8: ρ_6 is 1.6e-8 off
        oracle = run_trajectory(OptimizerSpec(name="radam", **hp), {"w": np.zeros(1)}, grads=[{"w": np.ones(1)}] * 6)
        # the step read back as p_6 − p_5 carries their rounding, u·|p| = 5.5e-19 against a step of 2.6e-6
        # (2.1e-13 relative), so 1e-12 (measured 6.4e-14) is the test's bound, not the oracle's precision
        assert abs((mp.mpf(float(oracle["params"][5]["w"][0])) - mp.mpf(float(oracle["params"][4]["w"][0])) + want) / want) < 1e-12
        # Adam, β1 = β2 = 1 − 10⁻⁷: every step is lr/(1 + ε) exactly; 1 − βᵗ as written keeps 9 digits
        exact = -mp.mpf(1e-3) / (1 + mp.mpf(1e-8))
        got_torch = torch_run(torch.optim.Adam, 3, betas=(1 - 1e-7, 1 - 1e-7))
        assert abs((mp.mpf(got_torch[2]) - 3 * exact) / (3 * exact)) > 1e-12  # measured 3.0e-11
