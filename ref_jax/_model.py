"""The trainer's model: the built-in one of `[model]` or the user's, its tensors by neutral name.

    m = make(config, info, ...)     # the run's model, floating tensors in precision.param_dtype

A user's model is the framework's own kind (ref_torch: a torch.nn.Module; ref_jax: a Flax NNX
module, or the pure form `(apply_fn, params)`). Neutral names are the framework's own paths to its
tensors, renamed by `[model] rename` (conformance.rules.names). The trainable parameters go to the
optimizer; the model's other tensors (frozen parameters, persistent buffers, an NNX module's
non-parameter state) are checkpointed beside them, so a BatchNorm's running statistics resume
exactly.
"""

# The JAX side: a built-in model, a user's Flax NNX module or the pure form `(apply_fn, params)`,
# as one pure function over flat {neutral name: array} dicts.
#
#     m = make(config, info, model)     # Model(apply, params, state, ...)
#     out, state = m.apply(params, state, x, key, train)
#
# - built-in ([model]): ref_jax.models.functional; no state; `key` drives the gpt's dropout.
# - NNX module: split into its graph, its nnx.Param leaves (`params`) and every other Variable
#   (`state`: BatchStat, RNG keys and counts, ...); apply merges them, calls the module on x (a
#   training-mode or an eval-mode graph: module.train() / module.eval(), which switch Dropout and
#   BatchNorm) and returns the state the call left (updated statistics, advanced RNG counts).
# - pure form: apply_fn(params_pytree, x) -> output over any pytree of parameters (linen:
#   `(model.apply, variables)`); no state.
#
# Neutral names: the pytree paths joined with "." (NNX `conv1.kernel`, `layers.0.bias`; dict keys,
# attribute names and sequence indices alike), renamed by `[model] rename`
# (conformance.rules.names). Parameters are cast to precision.param_dtype, floating state too; a
# typed PRNG key in the state is checkpointed as its uint32 key data (`to_tensors` / `from_tensors`).

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from conformance.config import Config
from conformance.data import DataInfo
from conformance.errors import CheckpointError, InputError
from conformance.rules.names import neutral_names
from ref_jax import backend
from ref_jax._nnx import set_autocast
from ref_jax.models import build_model, functional, named_parameters


class Model(NamedTuple):
    """A model as a pure function: apply(params, state, x, key, train) -> (output, state); the
    initial params and state by neutral name; `write_back(params, state)` puts final values into
    the user's NNX module (a no-op otherwise)."""

    apply: Callable[..., Any]
    params: dict[str, Any]
    state: dict[str, Any]
    write_back: Callable[[dict[str, Any], dict[str, Any]], None]


def _key_str(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def path_name(path: tuple[Any, ...]) -> str:
    """A pytree / NNX state path as a neutral name: its parts joined with "."."""
    return ".".join(_key_str(p) for p in path)


def _cast(value: Any, dtype: Any) -> Any:
    a = jnp.asarray(value)
    return a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a


def _builtin(config: Config, info: DataInfo, dtype: Any) -> Model:
    module = build_model(config.model, info, seed=config.run.seed, dtype=config.precision.param_dtype)
    if config.precision.autocast:  # torch.autocast's semantics, op by op, over float32 master weights
        set_autocast(module, backend.framework_dtype(config.precision.compute_dtype))
    f = functional(module)

    def apply(params: Any, state: Any, x: Any, key: Any, train: bool) -> tuple[Any, Any]:
        return f(params, x, key if train else None), state

    return Model(apply, dict(named_parameters(module)), {}, lambda p, s: None)


def _nnx(module: nnx.Module, rename: Mapping[str, str], dtype: Any) -> Model:
    module.train()
    graph_train, params, rest = nnx.split(module, nnx.Param, ...)
    module.eval()
    graph_eval = nnx.graphdef(module)
    module.train()
    p_flat = [(tuple(path), v) for path, v in nnx.to_flat_state(params)]
    s_flat = [(tuple(path), v) for path, v in nnx.to_flat_state(rest)]
    names = neutral_names([path_name(p) for p, _ in p_flat + s_flat], rename)
    p_paths = {names[path_name(p)]: p for p, _ in p_flat}
    s_paths = {names[path_name(p)]: p for p, _ in s_flat}
    p0 = {n: _cast(v.get_value(), dtype) for n, (_, v) in zip(p_paths, p_flat)}
    s0 = {n: _cast(v.get_value(), dtype) for n, (_, v) in zip(s_paths, s_flat)}

    def apply(p: Any, s: Any, x: Any, key: Any, train: bool) -> tuple[Any, Any]:
        del key  # an NNX module draws from its own nnx.Rngs (part of the state)
        m = nnx.merge(graph_train if train else graph_eval,
                      nnx.from_flat_state([(p_paths[n], p[n]) for n in p_paths]),
                      nnx.from_flat_state([(s_paths[n], s[n]) for n in s_paths]))
        out = m(x)
        after = dict(nnx.to_flat_state(nnx.state(m, nnx.Not(nnx.Param))))
        return out, {n: after[path].get_value() for n, path in s_paths.items()}

    def write_back(p: dict[str, Any], s: dict[str, Any]) -> None:
        nnx.update(module, nnx.from_flat_state([(p_paths[n], p[n]) for n in p_paths]
                                               + [(s_paths[n], s[n]) for n in s_paths]))

    return Model(apply, p0, s0, write_back)


def _pure(apply_fn: Callable[..., Any], tree: Any, rename: Mapping[str, str], dtype: Any) -> Model:
    if not callable(apply_fn):
        raise InputError(f"model as a pair must be (apply_fn, params); apply_fn is a {type(apply_fn).__name__}")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if not leaves:
        raise InputError("model = (apply_fn, params): params holds no array")
    own = [path_name(p) for p, _ in leaves]
    if len(set(own)) != len(own):
        raise InputError("model = (apply_fn, params): two parameters have the same path name")
    names = neutral_names(own, rename)
    order = [names[n] for n in own]
    p0 = {n: _cast(v, dtype) for n, (_, v) in zip(order, leaves)}

    def apply(p: Any, s: Any, x: Any, key: Any, train: bool) -> tuple[Any, Any]:
        del key, train  # a pure function has no mode; randomness would need its own key
        return apply_fn(jax.tree_util.tree_unflatten(treedef, [p[n] for n in order]), x), s

    return Model(apply, p0, {}, lambda p, s: None)


def make(config: Config, info: DataInfo, model: Any = None) -> Model:
    """The run's model: the built-in one of `[model]`, or the user's `model` with its floating
    tensors in precision.param_dtype."""
    # a user's NNX module is split into arrays; Model.write_back puts the final values back into it
    dtype = backend.framework_dtype(config.precision.param_dtype)
    if model is None:
        return _builtin(config, info, dtype)
    if isinstance(model, nnx.Module):
        return _nnx(model, config.model.rename, dtype)
    if isinstance(model, tuple) and len(model) == 2:
        return _pure(model[0], model[1], config.model.rename, dtype)
    raise InputError(f"model must be a Flax NNX module or a pair (apply_fn, params) for the JAX trainer; "
                     f"received {type(model).__name__}")


def load_pretrained(params: dict[str, Any], weights: Mapping[str, Any] | None) -> dict[str, Any]:
    """[model] init's neutral weights as the built-in model's parameters, cast to their dtypes (torch
    copies them in place, JAX returns new arrays); None leaves the seed's initialisation."""
    if weights is None:
        return params
    return {n: jnp.asarray(np.asarray(weights[n]), p.dtype) for n, p in params.items()}


def to_tensors(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Model state as NumPy for a checkpoint: a typed PRNG key as its uint32 key data."""
    out = {}
    for name, v in state.items():
        if jnp.issubdtype(v.dtype, jax.dtypes.prng_key):
            v = jax.random.key_data(v)
        out[name] = np.array(jax.device_get(v))
    return out


def expected(state: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtype names a checkpoint must have for this state (keys: their key data's)."""
    out = {}
    for name, v in state.items():
        if jnp.issubdtype(v.dtype, jax.dtypes.prng_key):
            data = jax.eval_shape(jax.random.key_data, v)
            out[name] = (tuple(data.shape), jnp.dtype(data.dtype).name)
        else:
            out[name] = (tuple(v.shape), jnp.dtype(v.dtype).name)
    return out


def from_tensors(like: Mapping[str, Any], saved: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The state back from checkpoint tensors (checked beforehand against `expected(like)`)."""
    out = {}
    for name, v in like.items():
        if jnp.issubdtype(v.dtype, jax.dtypes.prng_key):
            try:
                out[name] = jax.random.wrap_key_data(jnp.asarray(saved[name]), impl=jax.random.key_impl(v))
            except (TypeError, ValueError) as exc:
                raise CheckpointError(f"checkpoint tensor model/{name} is not a key of {v.dtype} ({exc})") from None
        else:
            out[name] = jnp.asarray(np.asarray(saved[name]))
    return out
