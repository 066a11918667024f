"""The trainer's model: the built-in one of `[model]` or the user's, its tensors by neutral name.

    m = make(config, info, ...)     # the run's model, floating tensors in precision.param_dtype

A user's model is the framework's own kind (ref_torch: a torch.nn.Module; ref_jax: a Flax NNX
module, or the pure form `(apply_fn, params)`). Neutral names are the framework's own paths to its
tensors, renamed by `[model] rename` (conformance.rules.names). The trainable parameters go to the
optimizer; the model's other tensors (frozen parameters, persistent buffers, an NNX module's
non-parameter state) are checkpointed beside them, so a BatchNorm's running statistics resume
exactly.
"""

# The torch side:
#
#     module = make(config, info, device, model)      # [model]'s, or the user's moved and cast
#     tensors = named(module, config.model.rename)      # Tensors: trainable, frozen, buffers
#     loss, output, targets = batch_loss(config, forward, loss_fn, batch)   # or batch_loss_fn(...)(batch)
#
# Neutral names are `named_parameters()` (a tied parameter once) and the persistent buffers of
# `named_buffers()` (the state_dict's). Trainable parameters are those with requires_grad; frozen
# ones and buffers go to model.safetensors beside them. The model is called on the batch entry
# `data.inputs`; `[loss]` compares its output with `data.targets`, or `loss_fn(output, batch) ->
# (sum, count)` reads the whole batch (every entry as a tensor on the device, and `sample_mask`,
# True for every real sample).

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from conformance.config import Config
from conformance.data import DataInfo
from conformance.data.user import SAMPLE_MASK
from conformance.errors import InputError
from conformance.rules.inputs import INDEX_LOSSES
from conformance.rules.names import neutral_names
from ref_torch.backend import framework_dtype
from ref_torch.losses import LossOutput, compute_loss
from ref_torch.models import build_model
from ref_torch.precision import autocast

_NUMPY = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


class Tensors(NamedTuple):
    """A model's tensors by neutral name: `params` the optimizer updates, `frozen` parameters
    (requires_grad False) and persistent `buffers`; `all()` is what a checkpoint's model holds."""

    params: dict[str, Any]
    frozen: dict[str, Any]
    buffers: dict[str, Any]

    def all(self) -> dict[str, Any]:
        return {**self.params, **self.frozen, **self.buffers}


def make(config: Config, info: DataInfo, device: torch.device, model: Any = None) -> torch.nn.Module:
    """The run's model: the built-in one of `[model]`, or the user's `model` with its floating
    tensors in precision.param_dtype."""
    # the user's module is moved to `device` and cast in place: the user's object is trained
    if model is None:
        return build_model(config.model, info, seed=config.run.seed, dtype=config.precision.param_dtype,
                           device=device)
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module for the torch trainer; received {type(model).__name__}")
    return model.to(device=device, dtype=framework_dtype(config.precision.param_dtype)).train()


def load_pretrained(model: torch.nn.Module, weights: Mapping[str, Any] | None) -> None:
    """[model] init's neutral weights as the built-in model's parameters, cast to their dtypes (torch
    copies them in place, JAX returns new arrays); None leaves the seed's initialisation."""
    if weights is None:
        return
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.asarray(weights[name])).to(p.dtype))


def named(module: torch.nn.Module, rename: Mapping[str, str]) -> Tensors:
    """The module's tensors by neutral name (after wrapping: FSDP replaces the parameters)."""
    params = dict(module.named_parameters())
    kept = set(module.state_dict().keys())  # persistent buffers only
    buffers = {n: b for n, b in module.named_buffers() if n in kept}
    names = neutral_names([*params, *buffers], rename)
    if not any(p.requires_grad for p in params.values()):
        raise InputError("the model has no trainable parameter (every requires_grad is False)")
    return Tensors({names[n]: p for n, p in params.items() if p.requires_grad},
                   {names[n]: p for n, p in params.items() if not p.requires_grad},
                   {names[n]: b for n, b in buffers.items()})


def to_device(fields: Mapping[str, Any], device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """A NumPy batch as tensors: floating entries in the parameter dtype, integer and boolean ones as
    they are (pinned and copied asynchronously on CUDA)."""
    out = {}
    host = _NUMPY.get(dtype)
    cuda = device.type == "cuda"
    for key, a in fields.items():
        if host is not None and isinstance(a, np.ndarray):
            if a.dtype.kind == "f" and a.dtype != host:
                a = a.astype(host)  # cast on the host: cheaper than a torch op on a small batch
            t = torch.as_tensor(a)
        else:
            t = torch.as_tensor(a)
            if t.dtype != dtype and t.is_floating_point():
                t = t.to(dtype)
        if cuda:
            t = t.pin_memory().to(device, non_blocking=True)
        out[key] = t
    return out


def user_loss(loss_fn: Callable[[Any, Any], Any], out: Any, batch: Mapping[str, Any]) -> LossOutput:
    """loss_fn(output, batch) -> (sum, count) as a LossOutput (value = sum / count)."""
    got = loss_fn(out, batch)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise InputError(f"loss_fn must return (sum, count); received {type(got).__name__}")
    total, count = got
    if not isinstance(total, torch.Tensor) or total.ndim != 0:
        raise InputError("loss_fn's sum must be a scalar tensor (the loss summed over the batch)")
    total = total.float() if total.dtype in (torch.float16, torch.bfloat16) else total
    # non-blocking: a count on the host is staged at once, without waiting for the device
    count = torch.as_tensor(count).to(device=total.device, dtype=total.dtype, non_blocking=True)
    return LossOutput(total / count, total, count)


def batch_loss(config: Config, forward: Any, loss_fn: Callable[[Any, Any], Any] | None,
               batch: Mapping[str, Any]) -> tuple[LossOutput, Any, Any]:
    """(loss, output, targets) of one batch: the forward pass under autocast, then `[loss]` (class
    outputs (..., C) against (...) targets as (N, C) against (N,)) or loss_fn."""
    return batch_loss_fn(config, forward, loss_fn)(batch)


BatchLoss = Callable[[Mapping[str, Any]], tuple[LossOutput, Any, Any]]


def batch_loss_fn(config: Config, forward: Any, loss_fn: Callable[[Any, Any], Any] | None) -> BatchLoss:
    """batch_loss with the config read once: batch -> (loss, output, targets), the trainer's call per
    micro-batch (a few attribute reads fewer each time)."""
    inputs, targets, precision, spec = config.data.inputs, config.data.targets, config.precision, config.loss
    cast = precision.autocast
    index = spec.name in INDEX_LOSSES

    def run(batch: Mapping[str, Any]) -> tuple[LossOutput, Any, Any]:
        x = batch[inputs]
        if cast:
            with autocast(precision, x.device.type):
                out = forward(x)
        else:  # no context to enter: the common float32 step stays lean
            out = forward(x)
        if loss_fn is not None:
            mask = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
            return user_loss(loss_fn, out, {**batch, SAMPLE_MASK: mask}), out, None
        y = batch[targets]
        if index and (out.ndim > 2 or y.ndim > 1):  # (B, T, V) logits, (B, T) tokens
            out, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
        return compute_loss(spec, out, y), out, y

    return run
