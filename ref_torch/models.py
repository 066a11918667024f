"""The built-in models as framework modules (torch.nn; Flax NNX): linear, mlp (a classifier
with hidden layers) and gpt (nanoGPT).

Parameter names, layouts and initial values are the framework-neutral ones of conformance.rules.models
(docs/models.md): weights are stored [out, in] as torch's (y = x @ W.T + b), so a parameter dict
moves between the frameworks unchanged, and every LayerNorm uses LN_EPS. `build_model` loads the
NumPy initial parameters (torch: into a module made on the meta device, so torch's own init never
runs and its global generator is left untouched).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from conformance.config.model import ModelSpec
from conformance.data.splits import DataInfo
from conformance.rules.models import (
    LN_EPS,
    check_model_input,
    dims_from_params,
    init_params,
    model_dims,
)
from ref_torch.backend import framework_dtype

__all__ = ["GPT", "LN_EPS", "LinearModel", "MLP", "build_model", "forward", "functional", "last_logits",
           "named_parameters"]

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}


class LinearModel(nn.Linear):
    """y = x W^T + b. Parameters: `weight` [out, in], `bias` [out]."""


class MLP(nn.Sequential):
    """Per hidden width: Linear, activation, LayerNorm (optional); then Linear. Parameters are named
    by position as in nn.Sequential: `0.weight` [h, in], `0.bias`, `2.weight` (LayerNorm), ..."""

    def __init__(self, in_features: int, hidden: list[int], out_features: int, activation: str = "gelu",
                 norm: str = "layernorm", bias: bool = True) -> None:
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h, bias=bias), _ACTIVATIONS[activation]()]
            if norm == "layernorm":
                layers.append(nn.LayerNorm(h, eps=LN_EPS, bias=bias))
            width = h
        layers.append(nn.Linear(width, out_features, bias=bias))
        super().__init__(*layers)


class _SelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d)))


class _FeedForward(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class _Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=LN_EPS, bias=bias)
        self.attn = _SelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, eps=LN_EPS, bias=bias)
        self.mlp = _FeedForward(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer (nanoGPT): token + position embeddings, pre-LN blocks of causal
    self-attention and a GELU MLP, final LayerNorm, lm_head tied to the token embedding.
    Input: int token ids (B, T), T <= block_size; output: logits (B, T, vocab_size)."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([_Block(n_embd, n_head, dropout, bias) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, eps=LN_EPS, bias=bias),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self._tie_weights()

    def _tie_weights(self) -> None:
        # The tie must be redone whenever parameters are replaced (to_empty, load).
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def _make(spec: ModelSpec, info: DataInfo | None) -> nn.Module:
    dims = model_dims(spec, info)
    if spec.name == "linear":
        return LinearModel(dims.in_features, dims.out_features, bias=spec.bias)
    if spec.name == "mlp":
        return MLP(dims.in_features, list(spec.hidden), dims.out_features, spec.activation, spec.norm, spec.bias)
    return GPT(dims.vocab_size, dims.block_size, spec.n_layer, spec.n_head, spec.n_embd, spec.dropout, spec.bias)


def _load(model: nn.Module, params: dict[str, np.ndarray]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.ascontiguousarray(params[name])).to(p.dtype))


def build_model(spec: ModelSpec, info: DataInfo | None, seed: int = 0, dtype: str = "float32",
                device: Any = None) -> Any:
    """The model `spec` describes, with conformance.rules.models.init_params(spec, info, seed) cast to
    `dtype`, on `device` (default: the CPU), in training mode."""
    with torch.device("meta"):
        model = _make(spec, info)
    model = model.to_empty(device=device or "cpu").to(framework_dtype(dtype))
    if isinstance(model, GPT):
        model._tie_weights()
    _load(model, init_params(spec, info, seed))
    return model.train()


def named_parameters(model: Any) -> dict[str, Any]:
    """The model's parameters by neutral name, in the canonical order (tied weights once)."""
    return dict(model.named_parameters())


def functional(model: Any) -> Callable[..., Any]:
    """The model as a pure function f(params, x, key=None) of a {name: array} dict. On JAX `key`
    drives dropout (None: no dropout); torch draws dropout from its generator in train mode."""

    def apply(params: dict[str, Any], x: Any, key: Any = None) -> Any:
        del key  # torch's dropout uses the global generator
        return torch.func.functional_call(model, params, (x,), tie_weights=True)

    return apply


def _loaded(spec: ModelSpec, params: dict[str, np.ndarray], dtype: str) -> nn.Module:
    # the model of `spec`, sized by the parameters' shapes, holding them, in eval mode
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    with torch.device("meta"):
        model = _make(spec.model_copy(update=dims_from_params(spec, shapes)), None)
    model = model.to_empty(device="cpu").to(framework_dtype(dtype))
    if isinstance(model, GPT):
        model._tie_weights()
    _load(model, params)
    return model.eval()


def forward(spec: ModelSpec, params: dict[str, np.ndarray], x: np.ndarray, dtype: str = "float64") -> np.ndarray:
    """Evaluate the model on NumPy input with the given neutral parameters (eval mode): the output
    as float64 NumPy. The input is checked on the host first (same InputError on every backend)."""
    check_model_input(spec, params, x)
    model = _loaded(spec, params, dtype)
    inp = torch.from_numpy(np.asarray(x, np.int64 if spec.name == "gpt" else np.float64))
    if spec.name != "gpt":
        inp = inp.to(framework_dtype(dtype))
    with torch.inference_mode():
        return model(inp).to(torch.float64).numpy()


def last_logits(spec: ModelSpec, params: dict[str, np.ndarray], dtype: str = "float64") -> Callable[[np.ndarray], np.ndarray]:
    """The gpt `spec` with the given neutral parameters (eval mode) as a function of a token window
    (1-D int array, 1 <= length <= block_size) returning the float64 logits after its last token.
    The window is padded to block_size, so one program serves every length (causal attention: the
    padding changes no earlier position)."""
    model = _loaded(spec, params, dtype)
    block = model.block_size

    def logits(window: np.ndarray) -> np.ndarray:
        n = len(window)
        padded = np.zeros((1, block), np.int64)
        padded[0, :n] = window
        with torch.inference_mode():
            return model(torch.from_numpy(padded))[0, n - 1].to(torch.float64).numpy()

    return logits
