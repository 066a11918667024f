"""The built-in models as framework modules (torch.nn; Flax NNX): linear, mlp (a classifier
with hidden layers) and gpt (nanoGPT).

Parameter names, layouts and initial values are the framework-neutral ones of conformance.rules.models
(docs/models.md): weights are stored [out, in] as torch's (y = x @ W.T + b), so a parameter dict
moves between the frameworks unchanged, and every LayerNorm uses LN_EPS. `build_model` loads the
NumPy initial parameters (torch: into a module made on the meta device, so torch's own init never
runs and its global generator is left untouched).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from conformance.config.model import ModelSpec
from conformance.data.splits import DataInfo
from conformance.errors import UnsupportedError
from conformance.rules.models import (
    LN_EPS,
    check_model_input,
    dims_from_params,
    init_params,
    model_dims,
    param_shapes,
)
from ref_jax._nnx import param_paths
from ref_jax.backend import framework_dtype

__all__ = ["GPT", "LN_EPS", "LinearModel", "MLP", "build_model", "forward", "functional", "last_logits",
           "named_parameters"]

_HALF = (jnp.bfloat16, jnp.float16)


def _wide(x: Any) -> Any:
    # torch's CPU kernels compute half-precision elementwise ops and norms in float32 and round once
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def _activation(name: str, x: Any) -> Any:
    w = _wide(x)
    if name == "gelu":
        y = jax.nn.gelu(w, approximate=False)  # torch's nn.GELU() default: the exact erf form
    else:
        y = jax.nn.relu(w) if name == "relu" else jnp.tanh(w)
    return y.astype(x.dtype)


def _linear(x: Any, w: Any, b: Any, autocast: Any) -> Any:
    """x @ w.T + b. Under autocast (a half dtype, see ref_jax._nnx.set_autocast) as torch.autocast's linear:
    input, weight and bias in that dtype, float32 accumulation, one rounding after the bias."""
    if autocast is None:
        y = x @ w.T
        return y if b is None else y + b
    y = jnp.matmul(x.astype(autocast), w.astype(autocast).T, preferred_element_type=jnp.float32)
    if b is not None:
        y = y + b.astype(autocast).astype(jnp.float32)
    return y.astype(autocast)


def _dropout(x: Any, rate: float, key: Any, site: int) -> Any:
    # Inverted dropout as torch's; site numbers give every dropout its own key.
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(jax.random.fold_in(key, site), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


class _Linear(nnx.Module):
    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: Any) -> None:
        self.weight = nnx.Param(jnp.zeros((n_out, n_in), dtype))
        self.bias = nnx.Param(jnp.zeros((n_out,), dtype)) if bias else None
        self.autocast = None

    def __call__(self, x: Any) -> Any:
        return _linear(x, self.weight[...], None if self.bias is None else self.bias[...], self.autocast)


class _LayerNorm(nnx.Module):
    def __init__(self, n: int, bias: bool, dtype: Any) -> None:
        self.weight = nnx.Param(jnp.ones((n,), dtype))
        self.bias = nnx.Param(jnp.zeros((n,), dtype)) if bias else None

    def __call__(self, x: Any) -> Any:
        # Two-pass biased variance, as torch (flax's fast variance E[x²]−E[x]² loses digits).
        w = _wide(x)
        mean = w.mean(axis=-1, keepdims=True)
        var = jnp.square(w - mean).mean(axis=-1, keepdims=True)
        y = (w - mean) * jax.lax.rsqrt(var + LN_EPS) * self.weight[...]
        return (y if self.bias is None else y + self.bias[...]).astype(x.dtype)


class _Activation(nnx.Module):
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, x: Any) -> Any:
        return _activation(self.name, x)


class LinearModel(nnx.Module):
    """y = x W^T + b. Parameters: `weight` [out, in], `bias` [out]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = jnp.float32) -> None:
        self.weight = nnx.Param(jnp.zeros((out_features, in_features), dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), dtype)) if bias else None
        spec = ModelSpec(name="linear", in_features=in_features, out_features=out_features, bias=bias)
        self.param_names = tuple(param_shapes(spec, None))
        self.autocast = None

    def __call__(self, x: Any, key: Any = None) -> Any:
        return _linear(x, self.weight[...], None if self.bias is None else self.bias[...], self.autocast)


class MLP(nnx.Module):
    """Per hidden width: Linear, activation, LayerNorm (optional); then Linear. Parameters are named
    by position as in nn.Sequential: `0.weight` [h, in], `0.bias`, `2.weight` (LayerNorm), ..."""

    unnamed_container = "layers"  # the names are nn.Sequential's positions, without this list's name

    def __init__(self, in_features: int, hidden: list[int], out_features: int, activation: str = "gelu",
                 norm: str = "layernorm", bias: bool = True, dtype: Any = jnp.float32) -> None:
        layers: list[nnx.Module] = []
        width = in_features
        for h in hidden:
            layers += [_Linear(width, h, bias, dtype), _Activation(activation)]
            if norm == "layernorm":
                layers.append(_LayerNorm(h, bias, dtype))
            width = h
        layers.append(_Linear(width, out_features, bias, dtype))
        self.layers = nnx.List(layers)
        spec = ModelSpec(name="mlp", in_features=in_features, out_features=out_features, hidden=list(hidden),
                         activation=activation, norm=norm, bias=bias)
        self.param_names = tuple(param_shapes(spec, None))

    def __call__(self, x: Any, key: Any = None) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x


class _SelfAttention(nnx.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, dtype: Any) -> None:
        self.c_attn = _Linear(n_embd, 3 * n_embd, bias, dtype)
        self.c_proj = _Linear(n_embd, n_embd, bias, dtype)
        self.n_head, self.dropout = n_head, dropout

    def __call__(self, x: Any, key: Any, site: int) -> Any:
        b, t, d = x.shape
        qkv = self.c_attn(x)
        q, k, v = (_wide(z).reshape(b, t, self.n_head, d // self.n_head) for z in jnp.split(qkv, 3, axis=-1))
        # Spelled out rather than jax.nn.dot_product_attention, whose softmax runs in float32 even for
        # float64 inputs (measured 1.5e-7) and which has no dropout on the attention weights.
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // self.n_head)
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
        weights = _dropout(jax.nn.softmax(scores, axis=-1), self.dropout, key, site)
        # under autocast, a fused kernel as torch's SDPA: float32 inside, one rounding of the output
        y = jnp.einsum("bhqk,bkhd->bqhd", weights, v).astype(qkv.dtype)
        return _dropout(self.c_proj(y.reshape(b, t, d)), self.dropout, key, site + 1)


class _Block(nnx.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, dtype: Any) -> None:
        self.ln_1 = _LayerNorm(n_embd, bias, dtype)
        self.attn = _SelfAttention(n_embd, n_head, dropout, bias, dtype)
        self.ln_2 = _LayerNorm(n_embd, bias, dtype)
        self.mlp = nnx.Dict(c_fc=_Linear(n_embd, 4 * n_embd, bias, dtype),
                            c_proj=_Linear(4 * n_embd, n_embd, bias, dtype))
        self.dropout = dropout

    def __call__(self, x: Any, key: Any, site: int) -> Any:
        x = x + self.attn(self.ln_1(x), key, site)
        h = self.mlp["c_proj"](_activation("gelu", self.mlp["c_fc"](self.ln_2(x))))
        return x + _dropout(h, self.dropout, key, site + 2)


class _Transformer(nnx.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float, bias: bool, dtype: Any) -> None:
        self.wte = nnx.Dict(weight=nnx.Param(jnp.zeros((vocab_size, n_embd), dtype)))
        self.wpe = nnx.Dict(weight=nnx.Param(jnp.zeros((block_size, n_embd), dtype)))
        self.h = nnx.List([_Block(n_embd, n_head, dropout, bias, dtype) for _ in range(n_layer)])
        self.ln_f = _LayerNorm(n_embd, bias, dtype)


class GPT(nnx.Module):
    """Decoder-only transformer (nanoGPT): token + position embeddings, pre-LN blocks of causal
    self-attention and a GELU MLP, final LayerNorm, lm_head tied to the token embedding.
    Input: int token ids (B, T), T <= block_size; output: logits (B, T, vocab_size)."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, bias: bool = True, dtype: Any = jnp.float32) -> None:
        self.transformer = _Transformer(vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias, dtype)
        self.block_size, self.dropout = block_size, dropout
        self.autocast = None
        spec = ModelSpec(name="gpt", vocab_size=vocab_size, block_size=block_size, n_layer=n_layer,
                         n_head=n_head, n_embd=n_embd, dropout=dropout, bias=bias)
        self.param_names = tuple(param_shapes(spec, None))

    def __call__(self, idx: Any, key: Any = None) -> Any:
        wte = self.transformer.wte["weight"][...]
        x = wte[idx] + self.transformer.wpe["weight"][...][: idx.shape[1]]
        x = _dropout(x, self.dropout, key, 0)
        for i, block in enumerate(self.transformer.h):
            x = block(x, key, 1 + 3 * i)
        return _linear(self.transformer.ln_f(x), wte, None, self.autocast)  # lm_head, tied to wte


def _make(spec: ModelSpec, info: DataInfo | None, dtype: Any) -> nnx.Module:
    dims = model_dims(spec, info)
    if spec.name == "linear":
        return LinearModel(dims.in_features, dims.out_features, spec.bias, dtype)
    if spec.name == "mlp":
        return MLP(dims.in_features, list(spec.hidden), dims.out_features, spec.activation, spec.norm, spec.bias, dtype)
    return GPT(dims.vocab_size, dims.block_size, spec.n_layer, spec.n_head, spec.n_embd, spec.dropout, spec.bias, dtype)


def _check_dtype(dtype: str) -> Any:
    dt = framework_dtype(dtype)
    if jax.dtypes.canonicalize_dtype(dt) != jnp.dtype(dt):  # x64 off: float64 would silently become float32
        raise UnsupportedError(f"dtype {dtype} needs JAX's 64-bit mode: run inside ref_jax.backend.context() "
                               f"or set JAX_ENABLE_X64=1")
    return dt


def _load(model: nnx.Module, params: dict[str, Any], dt: Any) -> None:
    paths = param_paths(model)
    nnx.update(model, nnx.from_flat_state([(paths[n], jnp.asarray(np.asarray(params[n]), dt)) for n in paths]))


def build_model(spec: ModelSpec, info: DataInfo | None, seed: int = 0, dtype: str = "float32",
                device: Any = None) -> Any:
    """The model `spec` describes, with conformance.rules.models.init_params(spec, info, seed) cast to
    `dtype`, on `device` (default: the CPU), in training mode."""
    dt = _check_dtype(dtype)
    model = _make(spec, info, dt)
    _load(model, init_params(spec, info, seed), dt)
    if device is not None:
        nnx.update(model, jax.device_put(nnx.state(model), device))
    return model


def named_parameters(model: Any) -> dict[str, Any]:
    """The model's parameters by neutral name, in the canonical order (tied weights once)."""
    paths = param_paths(model)
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    return {name: flat[path][...] for name, path in paths.items()}


def functional(model: Any) -> Callable[..., Any]:
    """The model as a pure function f(params, x, key=None) of a {name: array} dict. On JAX `key`
    drives dropout (None: no dropout); torch draws dropout from its generator in train mode."""
    graphdef, _ = nnx.split(model, nnx.Param)
    paths = param_paths(model)

    def apply(params: dict[str, Any], x: Any, key: Any = None) -> Any:
        state = nnx.from_flat_state([(paths[n], params[n]) for n in paths])
        return nnx.merge(graphdef, state)(x, key=key)

    return apply


def _loaded(spec: ModelSpec, params: dict[str, np.ndarray], dt: Any) -> nnx.Module:
    # the model of `spec`, sized by the parameters' shapes, holding them
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    model = _make(spec.model_copy(update=dims_from_params(spec, shapes)), None, dt)
    _load(model, params, dt)
    return model


def forward(spec: ModelSpec, params: dict[str, np.ndarray], x: np.ndarray, dtype: str = "float64") -> np.ndarray:
    """Evaluate the model on NumPy input with the given neutral parameters (eval mode): the output
    as float64 NumPy. The input is checked on the host first (same InputError on every backend)."""
    check_model_input(spec, params, x)
    dt = _check_dtype(dtype)
    model = _loaded(spec, params, dt)
    inp = jnp.asarray(np.asarray(x, np.int64)) if spec.name == "gpt" else jnp.asarray(np.asarray(x, np.float64), dt)
    return np.asarray(jax.device_get(model(inp)), np.float64)


def last_logits(spec: ModelSpec, params: dict[str, np.ndarray], dtype: str = "float64") -> Callable[[np.ndarray], np.ndarray]:
    """The gpt `spec` with the given neutral parameters (eval mode) as a function of a token window
    (1-D int array, 1 <= length <= block_size) returning the float64 logits after its last token.
    The window is padded to block_size, so one program serves every length (causal attention: the
    padding changes no earlier position)."""
    model = _loaded(spec, params, _check_dtype(dtype))
    apply, weights = functional(model), named_parameters(model)
    block = model.block_size
    step = jax.jit(lambda w, x, n: apply(w, x)[0, n - 1])

    def logits(window: np.ndarray) -> np.ndarray:
        n = len(window)
        padded = np.zeros((1, block), np.int32)
        padded[0, :n] = window
        return np.asarray(jax.device_get(step(weights, jnp.asarray(padded), n)), np.float64)

    return logits
