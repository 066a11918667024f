"""Optimizers in NumPy float64, one parameter at a time, written from torch.optim's equations.

Notation: p parameter, g gradient, t the parameter's update count after this update (1, 2, ...),
lr, wd (weight_decay), β1, β2 (betas), ε (eps). Every update starts with g ← −g when maximize;
"coupled" weight decay is g ← g + wd·p, "decoupled" (adamw, lion, adafactor, muon, and any
optimizer with decoupled_weight_decay) is p ← p·(1 − lr·wd) before the step, lr the group's lr.
Bias corrections 1 − βᵗ and RAdam's ρ_t are evaluated in forms that keep their digits for β near 1
(`conformance.oracle.corrections`; torch writes them as they read, docs/divergences.md O-CANCEL).

    sgd      b ← g on the first update, else μ·b + (1 − dampening)·g;  d = g + μ·b (nesterov) or b;
             p ← p − lr·d                                          (μ = 0: d = g, no buffer)
    adam     m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  v̂ = v/(1−β2ᵗ)  [amsgrad "torch": v_max ←
             max(v_max, v), v̂ = v_max/(1−β2ᵗ); "optax": v_hat_max ← max(v_hat_max, v/(1−β2ᵗ));
             "optax_raw": v_max ← max(v_max, v), v̂ = v_max];
             p ← p − lr/(1−β1ᵗ) · m / (√(v̂ + eps_root) + ε)        (adamw: decoupled decay)
             eps_hat (Keras): p ← p − lr·√(1−β2ᵗ)/(1−β1ᵗ) · m / (√v' + ε), v' = v or v_max
    rmsprop  v ← α·v + (1−α)·g²;  centered: ḡ ← α·ḡ + (1−α)·g, v' = v − ḡ²;  s = √v' + ε
             (eps_in_sqrt: √(v' + ε));  μ > 0: b ← μ·b + g/s, p ← p − lr·b;  else p ← p − lr·g/s
    adagrad  S ← S + g²;  p ← p − lr/(1 + (t−1)·lr_decay) · g/(√S + ε)
             (eps_in_sqrt, optax: g/√(S + ε), and 0 where S = 0);  S starts at initial_accumulator_value
    adamax   m ← β1·m + (1−β1)·g;  u ← max(β2·u, |g| + ε);  p ← p − lr/(1−β1ᵗ) · m/u
             eps_hat (Keras): u ← max(β2·u, |g|);  p ← p − lr/(1−β1ᵗ) · m/(u + ε)
    nadam    μ_t = β1·(1 − ½·0.96^(t·momentum_decay)) (momentum_schedule = false: μ_t = β1);
             Π ← Π·μ_t;  m, v as adam;  s = √(v/(1−β2ᵗ)) + ε;
             p ← p − lr·(1−μ_t)/(1−Π)·g/s − lr·μ_{t+1}/(1−Π·μ_{t+1})·m/s
             (eps_hat: s = (√v + ε)/√(1−β2ᵗ), i.e. ε on the raw √v)
    radam    m, v as adam;  ρ∞ = 2/(1−β2) − 1;  ρ_t = ρ∞ − 2t·β2ᵗ/(1−β2ᵗ);  m̂ = m/(1−β1ᵗ);
             ρ_t > 5: r = √((ρ_t−4)(ρ_t−2)ρ∞ / ((ρ∞−4)(ρ∞−2)ρ_t)), p ← p − lr·m̂·r·√(1−β2ᵗ)/(√v + ε);
             else p ← p − lr·m̂
    lion     p ← p·(1 − lr·wd);  p ← p − lr·sign(β1·m + (1−β1)·g);  m ← β2·m + (1−β2)·g
             (cautious: u = sign(...) becomes u·c·n/(Σc + 1), c = [u·g > 0], n = entries)
    ademamix (apple/ml-ademamix)  α_t = α·(t/T_α) for t < T_α, else α;  β3_t = f⁻¹((1−a)·f(β1) + a·f(β3))
             with a = t/T_β3 for t < T_β3, else β3, f(β) = ln ½ / ln(β + 10⁻⁸) − 1 (the EMA's half-life
             in updates, minus 1), f⁻¹(h) = ½^(1/(h+1));  m ← β1·m + (1−β1)·g;
             m_slow ← β3_t·m_slow + (1−β3_t)·g;  v ← β2·v + (1−β2)·g²;
             u = (m/(1−β1ᵗ) + α_t·m_slow) / (√v/√(1−β2ᵗ) + ε);  p ← p − lr·(u + wd·p)
    prodigy  all parameters at once, one shared d: conformance/oracle/prodigy.py
    adafactor  c = t^beta2_decay;  ρ = min(lr, 1/√t);  a = max(ε2, RMS(p))·ρ;  decoupled decay;
             ≥2-D: R ← R + c·(mean_last(g²) − R), C ← C + c·(mean_-2(g²) − C) over the last two
             axes, V = R·C / max(mean_-2(R), ε1);  else V ← V + c·(g² − V);
             u = g/√max(V, ε1²);  p ← p − a/max(1, RMS(u)/d) · u      (ε1 "auto" = finfo(dtype).eps)
    muon     b ← μ·b + (1−μ)·g;  x = g + μ·(b − g) (nesterov) or b;  O = NS(x) (Newton–Schulz in
             ns_dtype: X ← X/max(‖X‖_F, ε), then ns_steps × X ← aX + (bA + cA²)X with A = XXᵀ, on the
             wide orientation);  p ← p·(1 − lr·wd) − lr·s·O,  s = √max(1, rows/cols) ("original")
             or 0.2·√max(rows, cols) ("match_rms_adamw")
    schedule_free_adamw, schedule_free_sgd (schedulefree's AdamWScheduleFree / SGDScheduleFree; the
             parameter is the gradient point y, z starts at the first p; β = β1 or momentum):
             lr_t = lr·min(1, t/warmup_steps);  lr_max ← max(lr_max, lr_t);
             w = t^r · lr_max^weight_lr_power;  weight_sum ← weight_sum + w;  c = w/weight_sum (0 if 0);
             u = g/(√(v/(1−β2ᵗ)) + ε) with v ← β2·v + (1−β2)·g² (adamw) or u = g (sgd);  u ← u + wd·y;
             y ← y + c·(z − y) + lr_t·(β·(1−c) − 1)·u;  z ← z − lr_t·u
             (the reference's x ← (1−c)·x + c·z, y = β·x + (1−β)·z with x kept implicit: the
             evaluation point is x = (y − (1−β)·z)/β, eval_point)

A parameter without a gradient in an update is not updated and its state (including t) is left as
it was; a parameter's state is created at its first update, as torch does. Zero-size parameters
are left out of the optimizer (nothing to update; torch's Adafactor would divide by their size).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from conformance.config.ema import EmaSpec
from conformance.config.optimizer import ALWAYS_DECOUPLED, SCHEDULE_FREE, OptimizerSpec
from conformance.oracle import prodigy
from conformance.oracle.corrections import bias_correction, radam_rho
from conformance.oracle.ema import update_ema
from conformance.rules.groups import group_of, resolve_groups
from conformance.rules.trajectory import check_trajectory_inputs, objective_grads

State = dict[str, np.ndarray]


def _dtype_eps(dtype: str) -> float:
    if dtype == "bfloat16":
        return 2.0 ** -7
    return float(np.finfo(np.dtype(dtype)).eps)


def init_state(optimizer: str, hp: Mapping[str, Any], p: np.ndarray) -> State:
    """The state a parameter gets at its first update (neutral names, docs/contract.md §4)."""
    z = np.zeros_like(p)
    s: State = {"step": np.asarray(0, np.int64)}
    if optimizer in SCHEDULE_FREE:
        s.update(z=p.copy(), weight_sum=np.asarray(0.0), lr_max=np.asarray(0.0))
        if optimizer == "schedule_free_adamw":
            s["v"] = z.copy()
        return s
    if optimizer in ("sgd", "muon"):
        return s  # the momentum buffer is created by the first update
    if optimizer == "rmsprop":
        s["square_avg"] = z.copy()
        if hp["centered"]:
            s["grad_avg"] = z.copy()
        if hp["momentum"] > 0:
            s["momentum_buffer"] = z.copy()
    elif optimizer == "adagrad":
        s["sum"] = np.full_like(p, hp["initial_accumulator_value"])
    elif optimizer == "adamax":
        s.update(m=z.copy(), u=z.copy())
    elif optimizer == "lion":
        s["m"] = z.copy()
    elif optimizer == "ademamix":
        s.update(m=z.copy(), m_slow=z.copy(), v=z.copy())
    elif optimizer == "adafactor":
        if p.ndim > 1:
            s["row_var"] = np.zeros(p.shape[:-1] + (1,))
            s["col_var"] = np.zeros(p.shape[:-2] + (1,) + p.shape[-1:])
        else:
            s["variance"] = z.copy()
    else:  # adam, adamw, nadam, radam
        s.update(m=z.copy(), v=z.copy())
        if optimizer == "nadam":
            s["mu_product"] = np.asarray(1.0)
        if optimizer in ("adam", "adamw") and hp["amsgrad"]:
            s["v_hat_max" if hp["amsgrad_variant"] == "optax" else "v_max"] = z.copy()
    return s


def update(optimizer: str, hp: Mapping[str, Any], p: np.ndarray, g: np.ndarray, s: State,
           dtype: str = "float64") -> tuple[np.ndarray, State]:
    """One update of one parameter: (new p, new state). Inputs are not modified."""
    if hp.get("cautious_weight_decay") and hp["weight_decay"] != 0:  # decay only where u·p ≥ 0 (p ← p − lr·u)
        moved, s = update(optimizer, {**hp, "weight_decay": 0.0, "cautious_weight_decay": False}, p, g, s, dtype)
        return moved - hp["lr"] * hp["weight_decay"] * p * ((p - moved) * p >= 0), s
    s = {k: np.array(v, copy=True) for k, v in s.items()}
    t = int(s["step"]) + 1
    s["step"] = np.asarray(t, np.int64)
    lr, wd = hp["lr"], hp["weight_decay"]
    g = -g if hp.get("maximize") else g
    decoupled = optimizer in ALWAYS_DECOUPLED or hp.get("decoupled_weight_decay", False)
    if optimizer == "adafactor":
        return _adafactor(hp, p, g, s, t, dtype)
    if optimizer in SCHEDULE_FREE:
        return _schedule_free(optimizer, hp, p, g, s, t), s
    if optimizer == "ademamix":
        return _ademamix(hp, p, g, s, t), s
    if decoupled:
        p = p * (1 - lr * wd)
    else:
        g = g + wd * p
    if optimizer == "sgd":
        mu = hp["momentum"]
        if mu != 0:
            b = g.copy() if "momentum_buffer" not in s else mu * s["momentum_buffer"] + (1 - hp["dampening"]) * g
            s["momentum_buffer"] = b
            g = g + mu * b if hp["nesterov"] else b
        return p - lr * g, s
    if optimizer == "muon":
        return _muon(hp, p, g, s), s
    if optimizer == "lion":
        b1, b2 = hp["betas"]
        u = np.sign(b1 * s["m"] + (1 - b1) * g)
        if hp["cautious"]:  # C-Optim: zero where u disagrees with g, the rest scaled by n/(Σm + 1)
            m = (u * g > 0).astype(np.float64)
            u = u * (m * (m.size / (m.sum() + 1)))
        p = p - lr * u
        s["m"] = b2 * s["m"] + (1 - b2) * g
        return p, s
    if optimizer == "rmsprop":
        a, eps = hp["alpha"], hp["eps"]
        s["square_avg"] = a * s["square_avg"] + (1 - a) * g * g
        var = s["square_avg"]
        if hp["centered"]:
            s["grad_avg"] = a * s["grad_avg"] + (1 - a) * g
            var = var - s["grad_avg"] ** 2
        denom = np.sqrt(var + eps) if hp["eps_in_sqrt"] else np.sqrt(var) + eps
        if hp["momentum"] > 0:
            s["momentum_buffer"] = hp["momentum"] * s["momentum_buffer"] + g / denom
            return p - lr * s["momentum_buffer"], s
        return p - lr * g / denom, s
    if optimizer == "adagrad":
        clr = lr / (1 + (t - 1) * hp["lr_decay"])
        s["sum"] = s["sum"] + g * g
        if hp["eps_in_sqrt"]:
            safe = np.where(s["sum"] > 0, s["sum"], 1.0)
            step = np.where(s["sum"] > 0, g / np.sqrt(safe + hp["eps"]), 0.0)
        else:
            step = g / (np.sqrt(s["sum"]) + hp["eps"])
        return p - clr * step, s
    b1, b2 = hp["betas"]
    eps = hp["eps"]
    s["m"] = b1 * s["m"] + (1 - b1) * g
    if optimizer == "adamax":
        if hp["eps_hat"]:
            s["u"] = np.maximum(b2 * s["u"], np.abs(g))
            return p - lr / bias_correction(b1, t) * s["m"] / (s["u"] + eps), s
        s["u"] = np.maximum(b2 * s["u"], np.abs(g) + eps)
        return p - lr / bias_correction(b1, t) * s["m"] / s["u"], s
    s["v"] = b2 * s["v"] + (1 - b2) * g * g
    bc1, bc2 = bias_correction(b1, t), bias_correction(b2, t)
    if optimizer == "nadam":
        return _nadam(hp, p, g, s, t, bc2), s
    if optimizer == "radam":
        rho_inf = 2 / (1 - b2) - 1
        rho = radam_rho(b2, t)
        m_hat = s["m"] / bc1
        if rho > 5:
            rect = np.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
            return p - lr * m_hat * rect * np.sqrt(bc2) / (np.sqrt(s["v"]) + eps), s
        return p - lr * m_hat, s
    v_hat = s["v"] / bc2
    if hp["amsgrad"]:
        variant = hp["amsgrad_variant"]
        if variant == "optax":
            s["v_hat_max"] = np.maximum(s["v_hat_max"], v_hat)
            v_hat = s["v_hat_max"]
        else:
            s["v_max"] = np.maximum(s["v_max"], s["v"])
            v_hat = s["v_max"] / bc2 if variant == "torch" else s["v_max"]
    if hp["eps_hat"]:
        second = s["v_max"] if hp["amsgrad"] else s["v"]
        return p - lr * np.sqrt(bc2) / bc1 * s["m"] / (np.sqrt(second) + eps), s
    return p - lr / bc1 * s["m"] / (np.sqrt(v_hat + hp["eps_root"]) + eps), s


def ademamix_alpha(hp: Mapping[str, Any], t: int) -> float:
    """AdEMAMix's α at update t: linear from 0 over alpha_warmup updates (apple/ml-ademamix's
    linear_warmup_scheduler, (1 − a)·0 + a·α with a = t/T)."""
    warmup = hp["alpha_warmup"]
    return t / warmup * hp["alpha"] if t < warmup else hp["alpha"]


def ademamix_beta3(hp: Mapping[str, Any], t: int) -> float:
    """AdEMAMix's β3 at update t: from β1 to β3 linearly in the half-life over beta3_warmup updates
    (apple/ml-ademamix's linear_hl_warmup_scheduler)."""
    warmup, b1, b3 = hp["beta3_warmup"], hp["betas"][0], hp["beta3"]
    if t >= warmup:
        return b3

    def half_life(beta: float) -> float:
        return np.log(0.5) / np.log(beta + 1e-8) - 1

    a = t / warmup
    return float(0.5 ** (1 / ((1 - a) * half_life(b1) + a * half_life(b3) + 1)))


def _ademamix(hp: Mapping[str, Any], p: np.ndarray, g: np.ndarray, s: State, t: int) -> np.ndarray:
    b1, b2 = hp["betas"]
    b3, alpha = ademamix_beta3(hp, t), ademamix_alpha(hp, t)
    s["m"] = b1 * s["m"] + (1 - b1) * g
    s["m_slow"] = b3 * s["m_slow"] + (1 - b3) * g
    s["v"] = b2 * s["v"] + (1 - b2) * g * g
    bc1, bc2 = bias_correction(b1, t), bias_correction(b2, t)
    u = (s["m"] / bc1 + alpha * s["m_slow"]) / (np.sqrt(s["v"]) / np.sqrt(bc2) + hp["eps"])
    return p - hp["lr"] * (u + hp["weight_decay"] * p)


def _nadam(hp: Mapping[str, Any], p: np.ndarray, g: np.ndarray, s: State, t: int, bc2: float) -> np.ndarray:
    b1 = hp["betas"][0]
    if hp["momentum_schedule"]:
        psi = hp["momentum_decay"]
        mu, mu_next = b1 * (1 - 0.5 * 0.96 ** (t * psi)), b1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
    else:
        mu = mu_next = b1
    prod = float(s["mu_product"]) * mu
    s["mu_product"] = np.asarray(prod)
    denom = np.sqrt(s["v"] / bc2) + hp["eps"]
    if hp["eps_hat"]:
        denom = (np.sqrt(s["v"]) + hp["eps"]) / np.sqrt(bc2)
    lr = hp["lr"]
    return p - lr * (1 - mu) / (1 - prod) * g / denom - lr * mu_next / (1 - prod * mu_next) * s["m"] / denom


def _adafactor(hp: Mapping[str, Any], p: np.ndarray, g: np.ndarray, s: State, t: int, dtype: str):
    eps1, eps2 = hp["eps"]
    eps1 = _dtype_eps(dtype) if eps1 == "auto" else eps1
    c = float(t) ** hp["beta2_decay"]
    rho = min(hp["lr"], 1 / np.sqrt(t))
    alpha = max(eps2, np.sqrt(np.sum(p * p)) / np.sqrt(p.size)) * rho
    p = p * (1 - hp["lr"] * hp["weight_decay"])
    if g.ndim > 1:
        s["row_var"] = s["row_var"] + c * (np.mean(g * g, axis=-1, keepdims=True) - s["row_var"])
        s["col_var"] = s["col_var"] + c * (np.mean(g * g, axis=-2, keepdims=True) - s["col_var"])
        var = s["row_var"] * s["col_var"] / np.maximum(np.mean(s["row_var"], axis=-2, keepdims=True), eps1)
    else:
        s["variance"] = s["variance"] + c * (g * g - s["variance"])
        var = s["variance"]
    u = g / np.sqrt(np.maximum(var, eps1 * eps1))
    denom = max(1.0, np.sqrt(np.sum(u * u)) / (np.sqrt(u.size) * hp["d"]))
    return p - alpha / denom * u, s


def _schedule_free(optimizer: str, hp: Mapping[str, Any], p: np.ndarray, g: np.ndarray, s: State, t: int) -> np.ndarray:
    warmup = hp["warmup_steps"]
    lr = hp["lr"] * (t / warmup if t - 1 < warmup else 1.0)
    lr_max = max(float(s["lr_max"]), lr)
    weight = float(t) ** hp["r"] * lr_max ** hp["weight_lr_power"]
    weight_sum = float(s["weight_sum"]) + weight
    c = weight / weight_sum if weight_sum != 0 else 0.0
    s["lr_max"], s["weight_sum"] = np.asarray(lr_max), np.asarray(weight_sum)
    if optimizer == "schedule_free_adamw":
        beta, b2 = hp["betas"]
        s["v"] = b2 * s["v"] + (1 - b2) * g * g
        u = g / (np.sqrt(s["v"] / bias_correction(b2, t)) + hp["eps"])
    else:
        beta, u = hp["momentum"], g
    u = u + hp["weight_decay"] * p  # the decay is taken at y, the parameter in training
    y = p + c * (s["z"] - p) + lr * (beta * (1 - c) - 1) * u
    s["z"] = s["z"] - lr * u
    return y


def eval_point(optimizer: str, hp: Mapping[str, Any], y: np.ndarray, s: State) -> np.ndarray:
    """Schedule-free: the evaluation point x = (y − (1−β)·z)/β of a parameter at y with state s."""
    beta = hp["betas"][0] if optimizer == "schedule_free_adamw" else hp["momentum"]
    return (y - (1 - beta) * s["z"]) / beta


def newton_schulz(x: np.ndarray, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: str) -> np.ndarray:
    """torch.optim.Muon's orthogonalisation, every operation rounded to `dtype` (bfloat16: matmuls
    accumulate in float32 and round once, as torch's CPU kernels)."""
    a, b, c = coefficients
    if dtype == "bfloat16":
        import ml_dtypes

        def r(y: np.ndarray) -> np.ndarray:
            return np.asarray(y, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)

        work = np.float32
    else:
        work = np.dtype(dtype).type

        def r(y: np.ndarray) -> np.ndarray:
            return np.asarray(y, work)

    tall = x.shape[0] > x.shape[1]
    y = r(x.T if tall else x)
    norm = r(np.sqrt(np.sum(y.astype(work) * y, dtype=work)))
    y = r(y / r(np.maximum(norm, r(np.asarray(eps)))))
    for _ in range(steps):
        gram = r(y @ y.T)
        y = r(a * y + r(b * gram + c * (gram @ gram)) @ y)
    return np.asarray((y.T if tall else y), np.float64)


def _muon(hp: Mapping[str, Any], p: np.ndarray, g: np.ndarray, s: State) -> np.ndarray:
    mu = hp["momentum"]
    buf = s.get("momentum_buffer", np.zeros_like(g))
    buf = buf + (1 - mu) * (g - buf)
    s["momentum_buffer"] = buf
    x = g + mu * (buf - g) if hp["nesterov"] else buf
    o = newton_schulz(x, hp["ns_coefficients"], hp["ns_steps"], hp["eps"], hp["ns_dtype"])
    rows, cols = p.shape
    if hp["adjust_lr_fn"] == "original":
        scale = np.sqrt(max(1.0, rows / cols))
    else:
        scale = 0.2 * np.sqrt(max(rows, cols))
    return p - hp["lr"] * scale * o


def run_trajectory(
    spec: OptimizerSpec,
    params: Mapping[str, np.ndarray],
    grads: list[Mapping[str, np.ndarray]] | None = None,
    objective: Mapping[str, Any] | None = None,
    steps: int | None = None,
    dtype: str = "float64",
    state: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    ema: EmaSpec | None = None,
) -> dict[str, Any]:
    """Run `spec` on NumPy parameters: {"params": [after update 0, 1, ...], "state": [neutral
    state after each update], "ema": [the weights' EMA after each update, None before it starts]
    (with `ema`, an [ema] spec)}. Gradients are given per update (a parameter missing from an
    update's table has no gradient there) or come from `objective` (quadratic) for `steps`
    updates; `state` is a neutral state ({param: {name: array}}) to start from."""
    n = check_trajectory_inputs(spec, params, grads, objective, steps, state)
    groups = resolve_groups(spec, {k: np.shape(v) for k, v in params.items()})
    owner = group_of(groups)
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    states: dict[str, State] = {k: {n_: np.asarray(a, np.float64) if n_ != "step" else np.asarray(a, np.int64)
                                    for n_, a in v.items()} for k, v in (state or {}).items()}
    out_params, out_state, out_ema, average = [], [], [], None
    for k in range(n):
        gk = grads[k] if grads is not None else objective_grads(objective, p)
        if spec.name == "prodigy":  # one d for every parameter: all at once
            present = {name: np.asarray(g, np.float64) for name, g in gk.items() if p[name].size}
            p, states = prodigy.update_all([g.hyperparams for g in groups], owner, p, present, states)
        for name, g in gk.items() if spec.name != "prodigy" else ():
            if p[name].size == 0:
                continue  # zero-size parameters are left out of the optimizer (nothing to update)
            group = groups[owner[name]]
            st = states.get(name)
            if st is None:
                st = init_state(group.optimizer, group.hyperparams, p[name])
            p[name], states[name] = update(group.optimizer, group.hyperparams, p[name],
                                           np.asarray(g, np.float64), st, dtype)
        out_params.append({name: v.copy() for name, v in p.items()})
        out_state.append({name: {n_: a.copy() for n_, a in st.items()} for name, st in states.items()})
        if ema is not None and ema.enabled:
            average = update_ema(ema, average, p, k)
            out_ema.append(None if average is None else {name: v.copy() for name, v in average.items()})
    return {"params": out_params, "state": out_state, "ema": out_ema}
