"""The clipping rules of conformance.config.clip, chosen by mode in one place (`clip_with_norm`):
what the twin's clipping module and the trainer's update apply.

The rules: eps > 0 is torch's clip_grad_norm_ (always multiply by min(c / (n + eps), 1)); eps = 0
is optax.clip_by_global_norm's select (unchanged when n < c, else g / n · c); clip_value is
torch's clip_grad_value_ (optax.clip). Each twin applies them the way its framework keeps
gradients: ref_torch in place, ref_jax as new arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from conformance.config.clip import TORCH_EPS, ClipSpec


class _GradRef(NamedTuple):
    # torch.nn.utils' clip functions read `.grad` from "parameters"; this hands them bare gradients.
    grad: Any


def scale_by_norm(grads: list[Any], norm: Any, spec: ClipSpec) -> None:
    """Gradients clipped against `norm`: torch's rule for eps > 0, optax's select for eps = 0."""
    # in place, a list of tensors at once (one foreach kernel); outside autograd (torch's clip_grads_with_norm_ runs under no_grad itself)
    if spec.eps == TORCH_EPS:
        torch.nn.utils.clip_grads_with_norm_(list(map(_GradRef, grads)), spec.max_norm, norm)
        return
    with torch.no_grad():
        if spec.eps == 0:
            # optax's select: untouched below the threshold, (g / n) * c at or above it, where XLA
            # computes g / n as g * (1 / n); the same operations keep torch bit-for-bit equal to optax
            keep = norm < spec.max_norm
            inv = 1.0 / norm
            for g in grads:
                g.copy_(torch.where(keep, g, g * inv * spec.max_norm))
        else:
            coef = torch.clamp(spec.max_norm / (norm + spec.eps), max=1.0)
            torch._foreach_mul_(grads, coef)


@torch.no_grad()
def clip_with_norm(spec: ClipSpec, grads: Mapping[str, Any], norm: Any,
                   reduce_norm: Callable[[Any, float], Any] | None = None) -> None:
    """`grads` clipped by spec.mode, by value first when clip_value is set as well (the norm rule then
    takes the clamped gradients' norm); `norm` is their total norm before clipping, which the
    global-norm rule reuses (no second pass over the gradients) when nothing was clamped."""
    # In place on `grads` (name -> gradient or None). reduce_norm(norms, p): sharded parameters
    # (FSDP), each parameter's norm over every rank's shard from this rank's, one all-reduce for all
    # of them (clip.per_parameter).
    mode = spec.mode
    present = [g for g in grads.values() if g is not None]
    if mode == "none" or not present:
        return
    if spec.clip_value is not None:  # by value first: torch's clip_grad_value_ before clip_grad_norm_
        torch.nn.utils.clip_grad_value_([_GradRef(g) for g in present], spec.clip_value)
        if mode == "global_norm":  # the norm rule sees the clamped gradients, as clip_grad_norm_ would
            norm = torch.nn.utils.get_total_norm(present, spec.norm_type)
            norm = norm if reduce_norm is None else reduce_norm(norm, spec.norm_type)
    if mode == "value":
        return
    if mode == "global_norm":
        scale_by_norm(present, norm, spec)
    elif reduce_norm is not None:  # per_parameter over shards
        local = torch.stack([torch.nn.utils.get_total_norm([g], spec.norm_type) for g in present])
        for g, n in zip(present, reduce_norm(local, spec.norm_type)):
            scale_by_norm([g], n, spec)
    else:  # per_parameter
        for g in present:
            scale_by_norm([g], torch.nn.utils.get_total_norm([g], spec.norm_type), spec)
