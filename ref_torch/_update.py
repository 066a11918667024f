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

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from conformance.config.accumulation import AccumulationSpec
from conformance.config.clip import ClipSpec
from conformance.config.precision import PrecisionSpec
from conformance.errors import NonFiniteError
from conformance.rules.nonfinite import policy_raises
from ref_torch._clip_transforms import clip_with_norm
from ref_torch._parallel import World
from ref_torch.accumulation import accumulate_gradients
from ref_torch.clipping import check_norm, total_norm
from ref_torch.precision import (
    LossScaler,
    SkipState,
    check_nonfinite,
    finite_flags,
    grads_finite,
    record_update,
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


def apply_update(
    specs: UpdateSpecs,
    params: Mapping[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: LossScaler,
    skips: SkipState,
    loss_fn: Callable[[Any, Any], Any],
    window: Any,
    counts: Any = None,
    update: int | None = None,
    world: World | None = None,
) -> tuple[SkipState, UpdateInfo]:
    """Run one update in place (parameters, optimizer, scheduler, scaler); return the new counters
    and the update's metrics. Raises NonFiniteError per specs.precision before applying anything.

    `world` (ref_torch._parallel.World; None: one process) is how the update reduces over ranks:
    the window's count, the logged loss (the mean over ranks, so that every rank takes the same
    skip decision) and, for sharded parameters (FSDP), the finite flag and the norms of this rank's
    shards, which are unscaled, checked and clipped in place. The loss, the pre-clip norm and, with
    dynamic scaling, the finite flag and the scale in force reach the host in one transfer: the
    update's only read of the device. With a fused torch.optim kernel (the CUDA default) that read
    comes after the step: the step is held on the device by the kernel's found_inf (as GradScaler
    does) whenever the loss or the norm is not finite, so the host waits for nothing inside the
    update; any other optimizer reads before its step. Without scaling the gradients are finite
    exactly when their p-norm is (a NaN or inf element makes it NaN or inf); a norm that overflowed
    on finite elements is checked element by element, and its held step applied then."""
    ranks = world if world is not None and world.distributed else None
    sharded = ranks is not None and ranks.sharded
    scaling = scaler.enabled  # read once (a property over the precision spec)
    scale = scaler.state.scale if scaling else None  # update_scale makes new tensors
    grads, out = accumulate_gradients(specs.accumulation, loss_fn, params, window, counts,
                                      scale_loss=scaler.scale if scaling else None,
                                      reduce_count=ranks.reduce_count if ranks else None,
                                      no_sync=ranks.no_sync if ranks else None)
    loss = ranks.reduce_loss(out.loss) if ranks else out.loss
    grads = ranks.local_grads(grads) if ranks else grads
    clip, clip_step = specs.clip.targets()  # clip_step: clip.target = "updates", the step is clipped instead
    p = clip.norm_type
    if scaling:
        grads, grads_ok = scaler.unscale(grads)  # before clipping: the clip threshold is in the gradients' true scale
    norm = total_norm(grads, p)
    if sharded:
        norm = ranks.reduce_norm(norm, p)
        grads_ok = ranks.reduce_finite(grads_ok) if scaling else None
    loss_ok = torch.isfinite(loss)
    finite_dev = grads_ok & loss_ok if scaling else None  # the scaler's flag, on the device
    # clip_value would clamp an inf gradient to a finite one before the exact check could see it
    held = clip.clip_value is None and _holds_on_device(optimizer)
    if held:  # clip and step queued before the read; a non-finite loss or norm holds the step on the device
        clip_with_norm(clip, grads, norm, ranks.reduce_norm if sharded else None)
        step_ok = (finite_dev if scaling else loss_ok) & torch.isfinite(norm)
        _clipped_step(optimizer, update, clip_step, params, ranks, found_inf=(~step_ok).to(torch.float32))
    values = _to_host([loss, norm] + ([grads_ok, scale] if scaling else []))
    loss_v, norm_v = values[:2]
    scale_v = values[3] if scaling else None
    if scaling:
        grads_v = bool(values[2])
    else:
        # A NaN or inf gradient makes the p-norm (p > 0) NaN or inf, so the flag comes with the norm;
        # only a norm that overflowed on finite gradients needs the exact element-wise check.
        grads_v = math.isfinite(norm_v)
        if not grads_v and math.isfinite(loss_v):
            exact = grads_finite(grads)
            grads_v = bool(ranks.reduce_finite(exact) if sharded else exact)
    finite = bool(grads_v) and math.isfinite(loss_v)
    skips = record_update(skips, finite)
    if not finite and policy_raises(specs.precision, skips.consecutive):  # the flags are read to name the bad tensor
        loss_flag, grad_flags = finite_flags(loss, grads)
        if sharded and bool(loss_flag) and all(bool(v) for v in grad_flags.values()):
            grad_flags = {**grad_flags, "(a shard on another rank)": torch.tensor(False)}
        check_nonfinite(specs.precision, skips, loss_flag, grad_flags, update)
    elif finite and (not held or not math.isfinite(norm_v)):  # held: the norm overflowed on finite gradients
        if clip.mode != "none" and not math.isfinite(norm_v):
            check_norm(clip, norm, grads)  # error_if_nonfinite: raise naming the first bad one
        if not held:
            clip_with_norm(clip, grads, norm, ranks.reduce_norm if sharded else None)
        _clipped_step(optimizer, update, clip_step, params, ranks)
    if scaling:
        scaler.update(finite_dev)
    advanced = specs.precision.schedule_advances(not finite)
    if scheduler is not None and advanced:
        scheduler.step()
    return skips, UpdateInfo(loss_v, norm_v, not finite, scale_v, advanced)


_FUSED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad)  # kernels taking found_inf


def _holds_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the step can be held on the device: a torch.optim class whose fused kernel reads
    found_inf, with its state already made (a held first step would make it: Adam's zero moments,
    SGD's momentum buffers uninitialised), so that a held step leaves everything as a skip does."""
    if type(optimizer) not in _FUSED:
        return False
    state = optimizer.state
    for group in optimizer.param_groups:
        if not group.get("fused"):
            return False
        if type(optimizer) is torch.optim.SGD and not group["momentum"]:
            continue  # plain SGD keeps no state
        if any(p not in state for p in group["params"]):
            return False
    return True


def _step(optimizer: torch.optim.Optimizer, update: int | None, found_inf: torch.Tensor | None = None) -> None:
    """optimizer.step(), held on the device where found_inf (a fused kernel's float32 flag) is 1; a
    step scalar the hyper-parameters make too large for the parameters' dtype (Adam's lr / (1 -
    beta1^t) with lr near float32's largest value) is a non-finite step, refused as one, where torch
    would stop with its own RuntimeError."""
    try:
        if found_inf is None:
            optimizer.step()
        else:
            optimizer.found_inf = found_inf  # read by the fused kernel (torch.amp.GradScaler's protocol)
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf
    except RuntimeError as exc:
        if "without overflow" not in str(exc):
            raise
        dtype = str(next(p.dtype for g in optimizer.param_groups for p in g["params"])).removeprefix("torch.")
        lrs = ", ".join(f"{g['lr']:g}" for g in optimizer.param_groups)
        where = "" if update is None else f"update {update}: "
        raise NonFiniteError(f"{where}the optimizer step overflows {dtype} with lr {lrs}: a step scalar derived "
                             f"from the hyper-parameters is too large for {dtype}; lower optimizer.lr, or train "
                             f"in float64") from None


@torch.no_grad()
def _clipped_step(optimizer: torch.optim.Optimizer, update: int | None, clip_step: ClipSpec | None,
                  params: Mapping[str, Any], ranks: World | None, found_inf: torch.Tensor | None = None) -> None:
    """The step; with clip_step (clip.target = "updates") the step taken, Δ = p' − p, is clipped by
    its rules and p ← p + clip(Δ) (optax's clip after the optimizer); a held step is Δ = 0."""
    if clip_step is None:
        _step(optimizer, update, found_inf)
        return
    local = ranks.local_grads(dict(params)) if ranks else params  # this rank's shards under FSDP
    before = {k: v.detach().clone() for k, v in local.items()}
    _step(optimizer, update, found_inf)
    steps = {k: v.detach() - before[k] for k, v in local.items()}
    sharded = ranks is not None and ranks.sharded
    norm = total_norm(steps, clip_step.norm_type)
    clip_with_norm(clip_step, steps, ranks.reduce_norm(norm, clip_step.norm_type) if sharded else norm,
                   ranks.reduce_norm if sharded else None)
    for k, v in local.items():
        v.detach().copy_(before[k] + steps[k])


def _to_host(values: list[Any]) -> list[float]:
    """Scalars as Python floats in one read of the device (one stacked copy, on the CPU too, so
    that every device reads alike)."""
    device = values[0].device
    return torch.stack([v.to(device=device, dtype=torch.float64).reshape(()) for v in values]).tolist()
