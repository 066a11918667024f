"""The clipping rules of conformance.config.clip, chosen by mode in one place (`clip_with_norm`):
what the twin's clipping module and the trainer's update apply.

The rules: eps > 0 is torch's clip_grad_norm_ (always multiply by min(c / (n + eps), 1)); eps = 0
is optax.clip_by_global_norm's select (unchanged when n < c, else g / n · c); clip_value is
torch's clip_grad_value_ (optax.clip). Each twin applies them the way its framework keeps
gradients: ref_torch in place, ref_jax as new arrays.
"""

# Besides the rules by mode, optax GradientTransformations for the clipping rules optax lacks
# (torch's eps, p-norms, per leaf): `clip_transform(spec)` returns optax's own transform where it
# computes exactly the spec's rule (optax.clip for clip_value; optax.clip_by_global_norm for eps = 0
# with the 2-norm) and a custom stateless transform otherwise, so it composes in an optax.chain:
#
#     tx = optax.chain(clip_transform(spec), optax.adamw(1e-3))

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from conformance.config.clip import ClipSpec


def leaf_norm(x: Any, p: float) -> Any:
    """‖x‖_p of one flattened array (NaN propagates, as torch.linalg.vector_norm)."""
    a = jnp.abs(jnp.ravel(x))
    if a.size == 0:
        return jnp.zeros((), x.dtype)
    if math.isinf(p):
        return jnp.max(a)
    if p == 1:
        return jnp.sum(a)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a))
    return jnp.sum(a**p) ** (1.0 / p)


def tree_total_norm(tree: Any, p: float) -> Any:
    """torch's get_total_norm on a pytree: the p-norm of the per-leaf p-norms."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros(())
    return leaf_norm(jnp.stack([leaf_norm(x, p) for x in leaves]), p)


def scale_by_norm(x: Any, norm: Any, max_norm: float, eps: float) -> Any:
    """Gradients clipped against `norm`: torch's rule for eps > 0, optax's select for eps = 0."""
    # one array, returned new (mapped over a pytree by the callers)
    norm = norm.astype(x.dtype)
    if eps == 0:
        # optax's select; written as x * (1 / n) because XLA rewrites optax's x / n to exactly that
        return jax.lax.select(norm < max_norm, x, (x * (1.0 / norm)) * max_norm)
    # torch multiplies unconditionally by the coefficient clamped to 1
    return x * jnp.minimum(max_norm / (norm + eps), 1.0)


def clip_by_global_norm_torch(max_norm: float, eps: float = 1e-6, norm_type: float = 2.0) -> optax.GradientTransformation:
    """torch.nn.utils.clip_grad_norm_ as an optax transform (any p, any eps; eps = 0 is optax's rule)."""

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        norm = tree_total_norm(updates, norm_type)
        return jax.tree.map(lambda x: scale_by_norm(x, norm, max_norm, eps), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def clip_by_leaf_norm(max_norm: float, eps: float = 1e-6, norm_type: float = 2.0) -> optax.GradientTransformation:
    """Every leaf clipped against its own norm (torch: one clip_grad_norm_ call per parameter)."""

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        return jax.tree.map(lambda x: scale_by_norm(x, leaf_norm(x, norm_type), max_norm, eps), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def clip_transform(spec: ClipSpec) -> optax.GradientTransformation:
    """The optax transform for a [clip] spec (identity when nothing is clipped; clip_value with
    max_norm: optax.chain(optax.clip(v), the norm rule))."""
    mode = spec.mode
    if spec.clip_value is not None and mode != "value":
        return optax.chain(optax.clip(spec.clip_value), clip_transform(spec.model_copy(update={"clip_value": None})))
    if mode == "value":
        return optax.clip(spec.clip_value)
    if mode == "none":
        return optax.identity()
    if mode == "per_parameter":
        return clip_by_leaf_norm(spec.max_norm, spec.eps, spec.norm_type)
    if spec.eps == 0 and spec.norm_type == 2:
        return optax.clip_by_global_norm(spec.max_norm)
    return clip_by_global_norm_torch(spec.max_norm, spec.eps, spec.norm_type)


def clip_with_norm(spec: ClipSpec, grads: Any, norm: Any) -> Any:
    """`grads` clipped by spec.mode, by value first when clip_value is set as well (the norm rule then
    takes the clamped gradients' norm); `norm` is their total norm before clipping, which the
    global-norm rule reuses (no second pass over the gradients) when nothing was clamped."""
    # pure: new arrays (torch's clip_grad_norm_ computes the norm once too)
    if spec.clip_value is not None and spec.mode != "value":  # by value first, then the norm rule on
        grads = optax.clip(spec.clip_value).update(grads, optax.EmptyState())[0]  # the clamped gradients
        if spec.mode == "global_norm":
            norm = tree_total_norm(grads, spec.norm_type)
    if spec.mode == "global_norm":
        return jax.tree.map(lambda g: scale_by_norm(g, norm, spec.max_norm, spec.eps), grads)
    clip = clip_transform(spec)
    return clip.update(grads, clip.init(grads))[0]
