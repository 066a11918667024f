"""One optimizer update, the whole path, for the trainer and tests/test_update_path.py.

    scale → gradients over the window (accumulation) → unscale + finite check → clip → the
    optimizer's step (clip.target = "updates": the step clipped instead), or a skip → loss-scale
    update → the schedule advanced or held

A skipped update leaves parameters and optimizer state as they were, is counted in SkipState, and
advances the schedule only with schedule_on_skip = "advance". The non-finite policy raises before
anything is applied, so the last good state stays intact. Both twins return the update's metrics
as an UpdateInfo; ref_torch runs the update eagerly and in place (apply_update), ref_jax as one pure
function to jit (make_update_step) and a host part (finish_update), because a jitted step cannot
raise.
"""

# The JAX side: `make_update_step` returns one pure function (jit it once) over an UpdateState; the
# host then calls `finish_update` to apply the non-finite policy. Hyper-parameters are set per
# update through `hyperparams`: for the twinstep optimizer (ref_jax.optimizers) a sequence with one
# dict per parameter group, e.g. [{"lr": schedule(t)}], applied with set_group_hyperparams; for a tx
# built with optax.inject_hyperparams a mapping ({"learning_rate": ...}). Either way they are arrays
# inside jit, so a new value never recompiles, and a skipped update holds or advances the schedule
# exactly as the torch trainer's scheduler.step() does (the caller picks the position). The
# window's gradients come from ref_jax.accumulation.accumulate_gradients, the one accumulation loop
# (over a window laid out at a fixed shape with masks: ref_jax._window).

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from conformance.config.accumulation import AccumulationSpec
from conformance.config.clip import ClipSpec
from conformance.config.precision import PrecisionSpec
from ref_jax._clip_transforms import clip_with_norm
from ref_jax.accumulation import accumulate_gradients
from ref_jax.clipping import check_norm, total_norm
from ref_jax.optimizers import set_group_hyperparams
from ref_jax.precision import (
    LossScaleState,
    SkipState,
    check_nonfinite,
    finite_flags,
    grads_finite,
    record_update,
    scale_loss,
    unscale_grads,
    update_scale,
)


class UpdateSpecs(NamedTuple):
    """The config sections an update reads: accumulation, clip and precision (read once per run)."""

    accumulation: AccumulationSpec
    clip: ClipSpec
    precision: PrecisionSpec


class UpdateInfo(NamedTuple):
    """What the metrics line of one update needs (docs/contract.md §5)."""

    loss: float
    grad_norm: float
    skipped: bool
    loss_scale: float | None
    schedule_advanced: bool


class UpdateState(NamedTuple):
    """Parameters, optimizer state, loss scale, skip counters, and the model's own non-trainable
    state (None: a model without one)."""

    params: Any
    opt_state: Any
    scale: LossScaleState
    skips: SkipState
    model_state: Any = None


class DeviceInfo(NamedTuple):
    """Device-side results of one update; finish_update turns them into its UpdateInfo."""

    loss: Any
    grad_norm: Any
    skipped: Any
    loss_scale: Any
    loss_finite: Any
    grads_finite: Any
    consecutive: Any  # skipped updates in a row, this one included (the policy's count)


Hyperparams = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


def _with_hyperparams(opt_state: Any, hyperparams: Hyperparams) -> Any:
    if not hyperparams:
        return opt_state
    if isinstance(hyperparams, Mapping):  # an optax.inject_hyperparams state
        return opt_state._replace(hyperparams={**opt_state.hyperparams, **hyperparams})
    for group, values in enumerate(hyperparams):  # the twinstep optimizer: one dict per group
        if values:
            opt_state = set_group_hyperparams(opt_state, group, **values)
    return opt_state


def make_update_step(
    specs: UpdateSpecs, tx: optax.GradientTransformation, loss_fn: Callable[[Any, Any], Any],
) -> Callable[..., tuple[UpdateState, DeviceInfo]]:
    """step(state, window, counts=None, hyperparams=None) -> (state, info): one pure update over a
    window laid out by ref_jax._window (accumulate_gradients(specs.accumulation, loss_fn, ...)).
    With state.model_state (not None), loss_fn(params, micro_batch, model_state) -> (LossOutput,
    model_state) and the new state is the one after the window, applied or skipped (as torch's
    buffers, which the forward passes update in place)."""
    prec = specs.precision
    clip, clip_step = specs.clip.targets()  # clip_step: clip.target = "updates", the step is clipped instead

    def step(state: UpdateState, window: Any, counts: Any = None,
             hyperparams: Hyperparams = None) -> tuple[UpdateState, DeviceInfo]:
        scaler = (lambda loss: scale_loss(state.scale, loss)) if prec.dynamic_scaling else None
        grads, out = accumulate_gradients(specs.accumulation, loss_fn, state.params, window, counts,
                                          scale_loss=scaler, model_state=state.model_state)
        if prec.dynamic_scaling:
            # before clipping: the clip threshold is in the gradients' true scale
            grads, grads_ok = unscale_grads(state.scale, grads)
        else:
            grads_ok = grads_finite(grads)
        loss_ok = jnp.all(jnp.isfinite(out.loss))
        finite = grads_ok & loss_ok
        norm = total_norm(grads, clip.norm_type)  # no host check inside the step
        clipped = clip_with_norm(clip, grads, norm)
        opt_state = _with_hyperparams(state.opt_state, hyperparams)
        updates, new_opt = tx.update(clipped, opt_state, state.params)
        new_params = _clipped_step(clip_step, state.params, optax.apply_updates(state.params, updates))

        # error_if_nonfinite raises on the host (finish_update), so apply nothing here either
        applied = finite & jnp.isfinite(norm) if clip.error_if_nonfinite else finite

        def keep(new: Any, old: Any) -> Any:  # a skipped update changes nothing
            return jax.tree.map(lambda n, o: jnp.where(applied, n, o), new, old)

        _, grad_flags = finite_flags(out.loss, grads)
        skips = record_update(state.skips, finite)
        new_state = UpdateState(keep(new_params, state.params), keep(new_opt, opt_state),
                                update_scale(prec, state.scale, finite), skips, out.model_state)
        info = DeviceInfo(out.loss, norm, ~finite, state.scale.scale, loss_ok, grad_flags, skips.consecutive)
        return new_state, info

    return step


def finish_update(specs: UpdateSpecs, state: UpdateState, info: DeviceInfo,
                  update: int | None = None) -> UpdateInfo:
    """Host side of an update: apply the non-finite policy (NonFiniteError) and return the metrics.
    Reads only `info` (fetched in one transfer); `state` is the update's new state."""
    skipped = bool(info.skipped)
    if skipped:
        skips = SkipState(state.skips.skipped, info.consecutive)
        check_nonfinite(specs.precision, skips, info.loss_finite, info.grads_finite, update)
    else:
        check_norm(specs.clip.targets()[0], info.grad_norm, info.grads_finite)
    return UpdateInfo(float(info.loss), float(info.grad_norm), skipped,
                      float(info.loss_scale) if specs.precision.dynamic_scaling else None,
                      specs.precision.schedule_advances(skipped))


def _clipped_step(clip_step: ClipSpec | None, params: Any, new_params: Any) -> Any:
    """The parameters after the step; with clip_step (clip.target = "updates") the step taken,
    Δ = p' − p, is clipped by its rules and p + clip(Δ) returned (optax's clip after the optimizer),
    in torch's operations (its step is taken in place, then read back as p' − p)."""
    if clip_step is None:
        return new_params
    steps = jax.tree.map(lambda n, o: n - o, new_params, params)
    steps = clip_with_norm(clip_step, steps, total_norm(steps, clip_step.norm_type))
    return jax.tree.map(lambda o, d: o + d, params, steps)
