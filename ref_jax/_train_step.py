"""The JAX trainer's compiled step: one jitted function per run for the whole update.

    state, out = step(state, window, t)     # window: ref_jax._window arrays, placed on the mesh

inside which: the schedules give every group's lr (and onecycle's momentum/beta1) at the
schedule position `state.schedule_t` → ref_jax._update's path (scale → the window's gradients by
ref_jax.accumulation.accumulate_gradients → unscale → finite check → clip → optimizer update kept only if finite → loss-scale update) →
the position advances unless the update was skipped and schedule_on_skip = "hold". The position
lives on the device, so the host never has to wait for one update before launching the next.
The train state is donated: its buffers are reused for the new state. A model with state of its
own (an NNX module's BatchStat or RNG counts: ref_jax._model, UpdateState.model_state) threads it
through the window's micro-batches in order; as torch's buffers, it keeps what the forward passes
did to it even when the update is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from conformance.config import Config
from conformance.data.user import SAMPLE_MASK
from conformance.rules.schedules import cycled_hyperparameter, hyper_bases, hyper_field
from ref_jax._parallel import Placement
from ref_jax._update import DeviceInfo, UpdateSpecs, UpdateState, make_update_step
from ref_jax._window import WindowLayout, masked_loss
from ref_jax.losses import LossOutput, compute_loss
from ref_jax.precision import Policy

INDEX_LOSSES = ("cross_entropy", "nll")
UserLoss = Callable[[Any, Any], Any] | None


class TrainState(NamedTuple):
    """Everything that changes from one update to the next, on the device."""

    update: UpdateState
    schedule_t: Any  # int32: updates that advanced the schedule (Counters.schedule_t)


class StepOutput(NamedTuple):
    """One update's device-side results: the update path's info and the lr of every group."""

    info: DeviceInfo
    lrs: Any


def _element_mask(config: Config, out: Any, y: Any, rows: Any) -> Any:
    """The sample mask broadcast to the loss's element shape (classes dropped for index targets)."""
    if config.loss.name in INDEX_LOSSES and y.shape != out.shape:
        return rows
    return jnp.broadcast_to(rows.reshape(rows.shape + (1,) * (out.ndim - 1)), out.shape)


def user_loss(loss_fn: Callable[[Any, Any], Any], out: Any, data: Any, rows: Any) -> LossOutput:
    """loss_fn(output, batch) -> (sum, count) as a LossOutput (value = sum / count, 0 for a batch of
    padding only); the batch gains `sample_mask`, True for the real rows."""
    got = loss_fn(out, {**data, SAMPLE_MASK: rows})
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise TypeError(f"loss_fn must return (sum, count); received {type(got).__name__}")
    total = jnp.asarray(got[0])
    total = total.astype(jnp.float32) if total.dtype in (jnp.float16, jnp.bfloat16) else total
    count = jnp.asarray(got[1]).astype(total.dtype)
    return LossOutput(total / jnp.where(count > 0, count, jnp.ones_like(count)), total, count)


def forward_loss(config: Config, apply: Callable[..., Any], policy: Policy, layout: WindowLayout,
                 params: Any, mb: Any, key: Any = None, state: Any = None, train: bool = True,
                 loss_fn: UserLoss = None) -> tuple[LossOutput, Any, Any, Any]:
    """(loss, model output, targets, model state) of one micro-batch {"data": entries, "mask"}: the
    forward pass on data[inputs] (under autocast for a half compute dtype: the built-in models
    compute their linear maps in the Policy's compute dtype from float32 master weights,
    ref_jax._nnx.set_autocast), outputs cast to the Policy's output dtype, then `[loss]` against
    data[targets] with padding rows masked out, or loss_fn. A language model's logits (B, T, V)
    meet targets as (B·T, V) against (B·T,)."""
    data, rows = mb["data"], mb["mask"]
    out, state = apply(params, state, data[config.data.inputs], key, train)
    out = policy.cast_to_output(out)
    if loss_fn is not None:
        return user_loss(loss_fn, out, data, rows), out, None, state
    y = data[config.data.targets]
    logits = out
    if layout.tokens or (config.loss.name in INDEX_LOSSES and out.ndim > 2):
        rows = jnp.broadcast_to(rows.reshape(rows.shape + (1,) * (y.ndim - 1)), y.shape).reshape(-1)
        out, y = out.reshape(-1, out.shape[-1]), y.reshape(-1)
    raw = compute_loss(config.loss, out, y, mask=_element_mask(config, out, y, rows))
    return masked_loss(config.loss, raw, jnp.sum(rows)), logits, y, state


def make_loss_fn(config: Config, apply: Callable[..., Any], policy: Policy, layout: WindowLayout,
                 key: Any = None, loss_fn: UserLoss = None) -> Callable[[Any, Any, Any], tuple[LossOutput, Any]]:
    """loss_fn(params, micro_batch, model_state) -> (LossOutput, model_state) for the window
    accumulation; `key` (one per update) drives the built-in gpt's dropout, folded with the
    micro-batch index "j"."""

    def micro(params: Any, mb: Any, state: Any) -> tuple[LossOutput, Any]:
        mb_key = None if key is None else jax.random.fold_in(key, mb["j"])
        out, _, _, state = forward_loss(config, apply, policy, layout, params, mb, mb_key, state, True, loss_fn)
        return out, state

    return micro


def _hyperparams(config: Config, tables: dict[str, Any], opt_state: Any, position: Any) -> tuple[list[dict], Any]:
    lrs = tables["lr"][position]  # one row per schedule position, one column per group
    groups: list[dict[str, Any]] = [{"lr": lrs[g]} for g in range(lrs.shape[0])]
    if "momentum" in tables:
        cycled = cycled_hyperparameter(config.schedule, config.optimizer)
        for g, m in enumerate(tables["momentum"][position]):
            if cycled == "momentum":
                groups[g]["momentum"] = m
            else:  # beta1: betas[0] cycles, betas[1] stays
                groups[g]["betas"] = (m, opt_state.hyperparams[g]["betas"][1])
    for key, bases in hyper_bases(config.schedule, config.optimizer).items():
        values = tables[f"hyper.{key}"][position]
        for g, base in enumerate(bases):
            if base is not None:  # the groups that read the key (static: the config's)
                field, value = hyper_field(key, {**opt_state.hyperparams[g], **groups[g]}, values[g])
                groups[g][field] = value
    return groups, lrs


def make_train_step(config: Config, apply: Callable[..., Any], policy: Policy, tx: Any, layout: WindowLayout,
                    place: Placement, loss_fn: UserLoss = None) -> Callable[..., tuple[TrainState, StepOutput]]:
    """The jitted, donating train step step(state, window, t, tables, root_key) -> (state, StepOutput).

    `tables` holds the schedule's values at every position ({"lr": [positions, groups],
    "momentum" when onecycle cycles it, "hyper.<key>" for [schedule.hyper]}), computed once in float64 and rounded to the parameter
    dtype, as torch applies its double-precision lr: a float32 run never evaluates cos() near its
    end in float32 (measured 1e-6 relative error there). `loss_fn`: a user's, instead of [loss]."""
    specs = UpdateSpecs(config.accumulation, config.clip, config.precision)
    advance_on_skip = config.precision.schedule_on_skip == "advance"
    dropout = config.model.name == "gpt" and config.model.dropout > 0

    def step(state: TrainState, window: dict[str, Any], t: Any, tables: dict[str, Any],
             root_key: Any) -> tuple[TrainState, StepOutput]:
        key = jax.random.fold_in(root_key, t) if dropout else None
        micro = make_loss_fn(config, apply, policy, layout, key, loss_fn)

        def injected(p: Any, mb: Any, st: Any = None) -> Any:
            out, st = micro(p, mb, st)
            # [run] inject_nonfinite: every micro-batch loss of the update × +inf before the backward
            # pass (conformance.run.batches.injected), so loss and gradients are non-finite as in an overflow
            factor = jnp.where(mb["inject"], jnp.inf, 1.0).astype(out.sum.dtype)
            out = LossOutput(out.value * factor, out.sum * factor, out.count)
            return out if state.update.model_state is None else (out, st)

        hyper, lrs = _hyperparams(config, tables, state.update.opt_state, state.schedule_t)
        new, info = make_update_step(specs, tx, injected)(state.update, window, None, hyper)
        moved = jnp.where(info.skipped, jnp.int32(advance_on_skip), jnp.int32(1))
        return TrainState(new, state.schedule_t + moved), StepOutput(info, lrs)

    return jax.jit(step, donate_argnums=(0,), out_shardings=place.replicated)


class EvalSums(NamedTuple):
    loss_sum: Any
    count: Any
    correct: Any
    predictions: Any


def make_eval_step(config: Config, apply: Callable[..., Any], policy: Policy, layout: WindowLayout,
                   place: Placement, loss_fn: UserLoss = None) -> Callable[[Any, Any, dict[str, Any]], EvalSums]:
    """eval(params, model_state, batch) -> EvalSums: the loss sum and count of one padded
    validation batch (eval mode: no dropout, BatchNorm's running statistics) and, for class losses
    (tokens included), correct argmax predictions among the targets that are not ignore_index, as
    the torch trainer counts them. The model state is read, not changed."""
    classes = config.loss.name in INDEX_LOSSES and loss_fn is None

    def evaluate(params: Any, state: Any, batch: dict[str, Any]) -> EvalSums:
        out, logits, y, _ = forward_loss(config, apply, policy, layout, params, batch, None, state, False, loss_fn)
        zero = jnp.zeros((), jnp.int32)
        if not classes:
            return EvalSums(out.sum, out.count, zero, zero)
        y = batch["data"][config.data.targets]
        valid = jnp.broadcast_to(batch["mask"].reshape(batch["mask"].shape + (1,) * (y.ndim - 1)), y.shape)
        valid = valid & (y != config.loss.ignore_index)
        hit = (jnp.argmax(logits, axis=-1) == y) & valid
        return EvalSums(out.sum, out.count, jnp.sum(hit, dtype=jnp.int32), jnp.sum(valid, dtype=jnp.int32))

    return jax.jit(evaluate, out_shardings=place.replicated)
