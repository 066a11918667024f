"""The built-in models' forward pass in NumPy float64, written from the equations.

    linear: y = x Wᵀ + b
    mlp:    per hidden width h: z = act(z W_iᵀ + b_i); z = LayerNorm(z); then y = z W_outᵀ + b_out
    gpt:    h = wte[idx] + wpe[0:T]; per block: h += attn(LN_1(h)); h += mlp(LN_2(h));
            logits = LN_f(h) wteᵀ  (lm_head tied to wte)
            attn(a) = c_proj(concat_heads(softmax(q kᵀ/√d_head + causal) v)), [q k v] = c_attn(a)
            mlp(a) = c_proj(GELU(c_fc(a)))
    GELU(x) = x·Φ(x) = ½x(1 + erf(x/√2)) (exact, torch's default);
    LayerNorm(x) = (x − mean)/√(var + 1e-5)·w + b, var biased (over the last axis).
"""

from __future__ import annotations

import math

import numpy as np

from conformance.config.model import ModelSpec
from conformance.rules.models import check_model_input

LN_EPS = 1e-5
_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU: ½x(1 + erf(x/√2))."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """gelu (exact), relu or tanh."""
    if name == "gelu":
        return gelu(x)
    if name == "relu":
        return np.maximum(x, 0.0)
    return np.tanh(x)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """(x − mean)/√(biased var + 1e-5)·weight + bias over the last axis."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + LN_EPS) * weight
    return y if bias is None else y + bias


def _linear(p: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    y = x @ p[f"{name}.weight"].T
    bias = p.get(f"{name}.bias")
    return y if bias is None else y + bias


def _ln(p: dict[str, np.ndarray], name: str, x: np.ndarray) -> np.ndarray:
    return layer_norm(x, p[f"{name}.weight"], p.get(f"{name}.bias"))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention(p: dict[str, np.ndarray], name: str, a: np.ndarray, n_head: int) -> np.ndarray:
    b, t, d = a.shape
    hd = d // n_head
    q, k, v = np.split(_linear(p, f"{name}.c_attn", a), 3, axis=-1)
    q, k, v = (z.reshape(b, t, n_head, hd).transpose(0, 2, 1, 3) for z in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    y = (_softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return _linear(p, f"{name}.c_proj", y)


def _mlp(spec: ModelSpec, p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    i = 0
    for _ in spec.hidden:
        x = activation(spec.activation, _linear(p, str(i), x))
        i += 2
        if spec.norm == "layernorm":
            x = _ln(p, str(i), x)
            i += 1
    return _linear(p, str(i), x)


def _gpt(spec: ModelSpec, p: dict[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
    wte = p["transformer.wte.weight"]
    h = wte[idx] + p["transformer.wpe.weight"][: idx.shape[1]]
    for layer in range(spec.n_layer):
        name = f"transformer.h.{layer}"
        h = h + _attention(p, f"{name}.attn", _ln(p, f"{name}.ln_1", h), spec.n_head)
        m = _ln(p, f"{name}.ln_2", h)
        h = h + _linear(p, f"{name}.mlp.c_proj", gelu(_linear(p, f"{name}.mlp.c_fc", m)))
    return _ln(p, "transformer.ln_f", h) @ wte.T


def forward(spec: ModelSpec, params: dict[str, np.ndarray], x: np.ndarray, dtype: str = "float64") -> np.ndarray:
    """The model's output for input x (features for linear/mlp, int token ids (B, T) for gpt)
    with the given neutral parameters, as float64 NumPy (eval mode: no dropout)."""
    check_model_input(spec, params, x)
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    if spec.name == "gpt":
        return _gpt(spec, p, np.asarray(x, np.int64))
    x = np.asarray(x, np.float64)
    if spec.name == "linear":
        y = x @ p["weight"].T
        return y if "bias" not in p else y + p["bias"]
    return _mlp(spec, p, x)
