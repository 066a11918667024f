"""The built-in models' framework-neutral side: parameter names, shapes, initial values, sizes.

Both ref_torch.models and ref_jax.models build their modules from these names and load the same
NumPy initial values, so a run starts from identical weights on either framework.

    dims   = model_dims(spec, info)           # in/out features, vocabulary, context length
    shapes = param_shapes(spec, info)         # {"0.weight": (64, 20), ...} in torch's order
    params = init_params(spec, info, seed=0)  # {name: float64 ndarray}

Names follow torch's `named_parameters()` of the modules in docs/models.md; every weight of a
linear map is stored [out, in] (y = x @ W.T + b) on both frameworks.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from conformance.config.model import ModelSpec
from conformance.errors import ConfigError, InputError
from conformance.rules.inputs import check_finite

if TYPE_CHECKING:  # a description of the data only; the rules do not read data
    from conformance.data.splits import DataInfo

LN_EPS = 1e-5  # every LayerNorm's eps: torch.nn.LayerNorm's default (flax's is 1e-6)


class ModelDims(NamedTuple):
    """Sizes the data fixes: input width (linear/mlp), outputs (linear/mlp), vocabulary and
    context length (gpt). Fields a model does not use are None."""

    in_features: int | None
    out_features: int | None
    vocab_size: int | None
    block_size: int | None


def model_dims(spec: ModelSpec, info: DataInfo | None) -> ModelDims:
    """Resolve the model's sizes from the spec and the data (the spec wins only where they agree)."""
    if spec.name == "gpt":
        data_vocab = None if info is None or info.vocab is None else len(info.vocab)
        vocab = spec.vocab_size if spec.vocab_size is not None else data_vocab
        if vocab is None:
            raise ConfigError("model.vocab_size is required when there is no text data to take it from")
        if data_vocab is not None and vocab < data_vocab:
            raise ConfigError(
                f"model.vocab_size = {vocab} is smaller than the data's vocabulary of {data_vocab} characters"
            )
        return ModelDims(None, None, vocab, spec.block_size)
    dims = []
    for field, data_value in (("in_features", None if info is None else info.in_features),
                              ("out_features", None if info is None else info.out_features)):
        value = getattr(spec, field)
        if value is None and data_value is None:
            raise ConfigError(f"model.{field} is required when there is no data to take it from")
        if value is not None and data_value is not None and value != data_value:
            raise ConfigError(f"model.{field} = {value} but data set {info.name} has {data_value}")
        dims.append(value if value is not None else data_value)
    return ModelDims(dims[0], dims[1], None, None)


def mlp_layers(spec: ModelSpec, dims: ModelDims) -> list[tuple[str, int, int]]:
    """(kind, in, out) of each nn.Sequential index of the mlp: linear / act / norm."""
    layers: list[tuple[str, int, int]] = []
    width = dims.in_features
    for h in spec.hidden:
        layers.append(("linear", width, h))
        layers.append(("act", h, h))
        if spec.norm == "layernorm":
            layers.append(("norm", h, h))
        width = h
    layers.append(("linear", width, dims.out_features))
    return layers


def param_shapes(spec: ModelSpec, info: DataInfo | None) -> dict[str, tuple[int, ...]]:
    """Every parameter's neutral name and shape, in torch's `named_parameters()` order."""
    dims = model_dims(spec, info)
    shapes: dict[str, tuple[int, ...]] = {}
    if spec.name == "linear":
        shapes["weight"] = (dims.out_features, dims.in_features)
        if spec.bias:
            shapes["bias"] = (dims.out_features,)
        return shapes
    if spec.name == "mlp":
        for i, (kind, n_in, n_out) in enumerate(mlp_layers(spec, dims)):
            if kind == "linear":
                shapes[f"{i}.weight"] = (n_out, n_in)
            elif kind == "norm":
                shapes[f"{i}.weight"] = (n_out,)
            if kind != "act" and spec.bias:
                shapes[f"{i}.bias"] = (n_out,)
        return shapes
    d = spec.n_embd
    shapes["transformer.wte.weight"] = (dims.vocab_size, d)
    shapes["transformer.wpe.weight"] = (dims.block_size, d)
    blocks = [("ln_1", None), ("attn.c_attn", (3 * d, d)), ("attn.c_proj", (d, d)), ("ln_2", None),
              ("mlp.c_fc", (4 * d, d)), ("mlp.c_proj", (d, 4 * d))]
    for layer in range(spec.n_layer):
        for part, weight in blocks:
            name = f"transformer.h.{layer}.{part}"
            shapes[f"{name}.weight"] = weight if weight is not None else (d,)
            if spec.bias:
                shapes[f"{name}.bias"] = (weight[0] if weight is not None else d,)
    shapes["transformer.ln_f.weight"] = (d,)
    if spec.bias:
        shapes["transformer.ln_f.bias"] = (d,)
    return shapes


def param_count(spec: ModelSpec, info: DataInfo | None, non_embedding: bool = False) -> int:
    """Number of parameters (the tied lm_head counted once, as wte). `non_embedding` leaves out the
    position embedding, as nanoGPT's get_num_params() does by default."""
    dims = model_dims(spec, info)  # in closed form: a config naming 10^7 layers is sized, never enumerated
    b = int(spec.bias)
    if spec.name == "linear":
        return dims.out_features * (dims.in_features + b)
    if spec.name == "mlp":
        return sum(n_out * (n_in + b) if kind == "linear" else n_out * (1 + b) if kind == "norm" else 0
                   for kind, n_in, n_out in mlp_layers(spec, dims))
    d = spec.n_embd
    per_layer = 12 * d * d + 2 * d + 11 * d * b  # ln_1, c_attn (3d x d), c_proj, ln_2, c_fc (4d x d), c_proj
    embeddings = dims.vocab_size * d + (0 if non_embedding else dims.block_size * d)
    return embeddings + spec.n_layer * per_layer + d * (1 + b)


def flops_per_token(spec: ModelSpec, info: DataInfo | None, seq_len: int | None = None) -> float:
    """Training FLOPs per token of a gpt (forward + backward), PaLM / nanoGPT estimate_mfu:
    6·N + 12·L·d·T, N = parameters without the position embedding, L = n_layer, d = n_embd,
    T = sequence length (seq_len, else the data's block size, else model.block_size)."""
    if spec.name != "gpt":
        raise ConfigError(f"model.name: flops_per_token is defined for gpt; received {spec.name!r}")
    n = param_count(spec, info, non_embedding=True)
    t = seq_len or (info.block_size if info is not None and info.block_size else spec.block_size)
    return float(6 * n + 12 * spec.n_layer * spec.n_embd * t)


def _rng(seed: int, name: str) -> np.random.Generator:
    # One stream per parameter, keyed by its name: adding a layer never shifts the others' values.
    key = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), key])))


def _norm_prefixes(spec: ModelSpec, info: DataInfo | None) -> tuple[str, ...]:
    """Name prefixes of the LayerNorm parameters (initialized to weight 1, bias 0)."""
    if spec.name == "gpt":
        return tuple(f"transformer.h.{i}.{ln}." for i in range(spec.n_layer) for ln in ("ln_1", "ln_2")) + (
            "transformer.ln_f.",
        )
    if spec.name == "mlp":
        layers = mlp_layers(spec, model_dims(spec, info))
        return tuple(f"{i}." for i, (kind, _, _) in enumerate(layers) if kind == "norm")
    return ()


def _fan_in(shapes: dict[str, tuple[int, ...]], name: str) -> int:
    # A Linear's bias shares its weight's fan-in (torch's reset_parameters).
    owner = name.rsplit(".", 1)[0] + "." if "." in name else ""
    return shapes[owner + "weight"][1]


def init_params(spec: ModelSpec, info: DataInfo | None, seed: int) -> dict[str, np.ndarray]:
    """Initial parameters as float64 NumPy arrays, in `param_shapes` order.

    linear, mlp: torch's default nn.Linear init, weight and bias ~ U(-1/√fan_in, 1/√fan_in);
    LayerNorm weight 1, bias 0. gpt (GPT-2 / nanoGPT): every Linear and Embedding weight
    ~ N(0, init_std²), the two residual projections (attn.c_proj, mlp.c_proj) ~
    N(0, (init_std/√(2·n_layer))²), Linear biases 0, LayerNorm weight 1, bias 0. Each parameter
    has its own PCG64 stream seeded by (seed, sha256(name)) (see docs/models.md)."""
    shapes = param_shapes(spec, info)
    norms = _norm_prefixes(spec, info)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        rng = _rng(seed, name)
        if name.startswith(norms):
            value = np.ones(shape) if name.endswith(".weight") else np.zeros(shape)
        elif spec.name == "gpt":
            if name.endswith(".bias"):
                value = np.zeros(shape)
            else:
                std = spec.init_std / math.sqrt(2 * spec.n_layer) if name.endswith("c_proj.weight") else spec.init_std
                value = rng.normal(0.0, std, shape)
        else:
            bound = 1.0 / math.sqrt(_fan_in(shapes, name))
            value = rng.uniform(-bound, bound, shape)
        out[name] = np.asarray(value, np.float64)
    return out


def dims_from_params(spec: ModelSpec, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """The ModelSpec size fields that a parameter set implies (to rebuild a model from weights)."""
    if spec.name == "gpt":
        sizes = {}
        for field, name in (("vocab_size", "transformer.wte.weight"), ("block_size", "transformer.wpe.weight")):
            shape = shapes.get(name)
            if shape is None or len(shape) != 2:
                raise InputError(f"parameter {name!r} is missing or not 2-D (received shape {shape})")
            sizes[field] = shape[0]
        return sizes
    last = "weight" if spec.name == "linear" else f"{len(spec.hidden) * (3 if spec.norm == 'layernorm' else 2)}.weight"
    first = "weight" if spec.name == "linear" else "0.weight"
    for name in (first, last):
        if name not in shapes or len(shapes[name]) != 2:
            raise InputError(f"parameter {name!r} is missing or not 2-D (received shape {shapes.get(name)})")
    return {"in_features": shapes[first][1], "out_features": shapes[last][0]}


def check_params(spec: ModelSpec, params: dict[str, np.ndarray]) -> None:
    """Raise InputError unless `params` has exactly the names and shapes the model needs."""
    shapes = {k: tuple(np.shape(v)) for k, v in params.items()}
    expected = param_shapes(spec.model_copy(update=dims_from_params(spec, shapes)), None)
    missing = [k for k in expected if k not in shapes]
    if missing:
        raise InputError(f"parameter {missing[0]!r} is missing ({len(missing)} missing in all)")
    extra = [k for k in shapes if k not in expected]
    if extra:
        raise InputError(f"parameter {extra[0]!r} is not a parameter of this {spec.name} model")
    for name, shape in expected.items():
        if shapes[name] != shape:
            raise InputError(f"parameter {name!r} has shape {shapes[name]}; the model needs {shape}")


def check_model_input(spec: ModelSpec, params: dict[str, np.ndarray], x: np.ndarray) -> None:
    """Host-side checks of a forward call, shared by every backend: the parameter set matches the
    model, gpt token ids are integers in range with T <= block_size, features are finite floats of
    the right width."""
    check_params(spec, params)
    x = np.asarray(x)
    dims = dims_from_params(spec, {k: tuple(np.shape(v)) for k, v in params.items()})
    if spec.name == "gpt":
        if not np.issubdtype(x.dtype, np.integer) or x.ndim != 2:
            raise InputError(
                f"gpt input must be integer token ids of shape (batch, time); received {x.dtype} {x.shape}"
            )
        if x.shape[1] > dims["block_size"]:
            raise InputError(f"gpt input has {x.shape[1]} positions; block_size is {dims['block_size']}")
        bad = (x < 0) | (x >= dims["vocab_size"])
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InputError(f"gpt input token {int(x[at])} at index {at} is out of range 0..{dims['vocab_size'] - 1}")
        return
    if not np.issubdtype(x.dtype, np.floating) or x.ndim < 1 or x.shape[-1] != dims["in_features"]:
        raise InputError(
            f"{spec.name} input must be floating point with {dims['in_features']} features in the last "
            f"dimension; received {x.dtype} {x.shape}"
        )
    check_finite(f"{spec.name} input", x)
