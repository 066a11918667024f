"""Prodigy in NumPy float64, all parameters at once, written from prodigyopt 1.1.2's Prodigy.step.

Prodigy (Mishchenko & Defazio 2024) is Adam whose step size is d·lr, with one estimate d of the
distance to the solution shared by every parameter. Per update, with k the updates taken so far,
lr the largest group lr (every group's lr is that or 0), c = √(1−β2^(k+1))/(1−β1^(k+1)) with
use_bias_correction (else 1) and dlr = d·lr·c:

    for every parameter with a gradient (g ← g + wd·p first when the decay is coupled), p₀ its
    value at its first update, and only in groups whose lr > 0:
        r ← Σ (d/d0)·dlr·⟨g, p₀ − p⟩                  (summed over parameters)
        m ← β1·m + d·(1−β1)·g;   v ← β2·v + d²·(1−β2)·g²
        s ← β3·s + (d/d0)·w·g,   w = d with safeguard_warmup, else dlr
    N ← β3·N + r;   D = Σ |s|  (every element of every such parameter)
    D = 0: prodigyopt returns early: m, v and s have moved, nothing else (parameters, steps, k, d, N)
    d̂ = d_coef·N/D;   d ← max(d, d̂) while d = d0;   d_max ← max(d_max, d̂);   d ← min(d_max, d·growth_rate)
    for every parameter with a gradient, with the new d and the old dlr:
        p ← p − wd·dlr·p (decoupled decay);   p ← p − dlr·m/(√v + d·ε);   its step ← step + 1
    k ← k + 1

β1 = 0 keeps no m and steps p ← p − dlr·d·g/(√v + d·ε) with the new d, as prodigyopt 1.1.2 does
(its β1 > 0 path, the paper's reference and optax.contrib.prodigy use the m of the old d).

The shared scalars d, d_max, N (`d_numerator`) and k are kept in every updated parameter's state
(docs/contract.md §4), all equal; they are read from the first parameter that has been updated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

State = dict[str, np.ndarray]
SHARED = ("d", "d_max", "d_numerator", "k")  # one value for the whole optimizer


def shared_values(hp: Mapping[str, Any], states: Mapping[str, State]) -> dict[str, float]:
    """d, d_max, d_numerator and k: from the first state that holds them, else their start."""
    for st in states.values():
        if int(st["step"]) > 0:
            return {key: float(st[key]) for key in SHARED}
    return {"d": hp["d0"], "d_max": hp["d0"], "d_numerator": 0.0, "k": 0.0}


def update_all(hps: Sequence[Mapping[str, Any]], owner: Mapping[str, int], params: Mapping[str, np.ndarray],
               grads: Mapping[str, np.ndarray], states: Mapping[str, State]) -> tuple[dict[str, np.ndarray],
                                                                                      dict[str, State]]:
    """One Prodigy update of every parameter: (new params, new states). `hps` holds each group's
    hyper-parameters (its lr the one in force), `owner` each parameter's group, `grads` the
    parameters that have a gradient, `states` the parameters updated before. Inputs are not modified."""
    hp0 = hps[0]
    b1, b2 = hp0["betas"]
    b3, d0 = hp0["beta3"], hp0["d0"]
    shared = shared_values(hp0, states)
    d, d_max, k = shared["d"], shared["d_max"], shared["k"]
    lr = max(h["lr"] for h in hps)
    bc = np.sqrt(1 - b2 ** (k + 1)) / (1 - b1 ** (k + 1)) if hp0["use_bias_correction"] else 1.0
    dlr = d * lr * bc
    new = {name: {key: np.array(v, copy=True) for key, v in st.items()} for name, st in states.items()}
    numerator, denominator, used = 0.0, 0.0, {}
    for name, g in grads.items():
        hp, p = hps[owner[name]], params[name]
        if hp["weight_decay"] != 0 and not hp["decouple"]:
            g = g + hp["weight_decay"] * p
        st = new.get(name) or {"step": np.asarray(0, np.int64), "v": np.zeros_like(p), "s": np.zeros_like(p),
                               "p0": np.array(p, copy=True), **({"m": np.zeros_like(p)} if b1 > 0 else {})}
        if hp["lr"] > 0:
            numerator += (d / d0) * dlr * float(np.dot(g.ravel(), (st["p0"] - p).ravel()))
            if b1 > 0:
                st["m"] = b1 * st["m"] + d * (1 - b1) * g
            st["v"] = b2 * st["v"] + d * d * (1 - b2) * g * g
            st["s"] = b3 * st["s"] + (d / d0) * (d if hp0["safeguard_warmup"] else dlr) * g
            denominator += float(np.sum(np.abs(st["s"])))
        used[name] = (st, g)
    if denominator == 0:  # the moments and sums have moved (every s is 0 now); a fresh state holds only zeros
        return dict(params), {**new, **{name: st for name, (st, _) in used.items() if name in states}}
    numerator += b3 * shared["d_numerator"]
    d_hat = hp0["d_coef"] * numerator / denominator
    if d == d0:
        d = max(d, d_hat)
    d_max = max(d_max, d_hat)
    d = min(d_max, d * hp0["growth_rate"])
    out = dict(params)
    for name, (st, g) in used.items():
        hp, p = hps[owner[name]], params[name]
        st["step"] = np.asarray(int(st["step"]) + 1, np.int64)
        if hp["weight_decay"] != 0 and hp["decouple"]:
            p = p - hp["weight_decay"] * dlr * p
        denom = np.sqrt(st["v"]) + d * hp["eps"]
        out[name] = p - dlr * st["m"] / denom if b1 > 0 else p - dlr * d * g / denom
        new[name] = st
    for st in new.values():
        st.update(d=np.asarray(d), d_max=np.asarray(d_max), d_numerator=np.asarray(numerator),
                  k=np.asarray(k + 1.0))
    return out, new
