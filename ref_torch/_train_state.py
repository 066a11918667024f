"""The trainer's run state and its checkpoint: restored from a checkpoint of either trainer, saved to
one, and the final weights read out.

A checkpoint holds what conformance.checkpoint defines for both trainers (docs/contract.md §5,
reliability.md §3.4's checklist): the model's tensors by neutral name in their own dtype
(parameters, frozen parameters and the model's own state, such as persistent buffers; the
parameters at a schedule-free optimizer's evaluation point x, as its package documents), the
weights' EMA ([ema]), the optimizer state in the neutral format (docs/contract.md §4's names;
"step" goes to meta["optimizer_step"]), the schedule position (counters.schedule_t) and
reduce_on_plateau's neutral state, the loss-scale state, the skip counters, every rank's
generators as `rank<i>/...` (conformance.checkpoint.rng.pack_rank_rng) and the data position (the
update count, checked against the data). What one framework does not know (torch's generator
states, a JAX key) the other ignores, so a checkpoint of either trainer resumes in the other.
"""

# The torch trainer's objects (Objects) are restored in place: `restore` fills them, the scheduler
# is rebuilt at the schedule position with build_scheduler(..., start=t), and a reduce_on_plateau
# scheduler gets its neutral state back with restore_plateau. The generators are torch CPU and
# CUDA, Python and NumPy.

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from conformance.checkpoint import Checkpoint, check_tensors, release
from conformance.checkpoint import whole as whole_checkpoint
from conformance.checkpoint.rng import capture_host_rng, pack_rank_rng, unpack_rank_rng
from conformance.errors import CheckpointError
from conformance.rules import plateau
from conformance.run import records
from conformance.run.session import Run
from conformance.run.validate import check_optimizer_entries
from ref_torch import _fsdp, _shards
from ref_torch import _parallel as ddp
from ref_torch._model import Tensors
from ref_torch._schedules import MetricPlateau, plateau_from_neutral
from ref_torch.backend import describe
from ref_torch._arrays import native_numpy
from ref_torch.checkpoint import restore_rng
from ref_torch.ema import export_ema, import_ema
from ref_torch.optimizers import (
    export_state,
    import_state,
    to_eval_point,
)
from ref_torch.precision import LossScaler, SkipState


class Objects(NamedTuple):
    """The framework objects a checkpoint fills: the bare module (not a DDP wrapper), the optimizer,
    the loss scaler, the module's tensors by neutral name and the weights' EMA
    (ref_torch.ema.EmaState, None without [ema])."""

    model: Any
    optimizer: Any
    scaler: LossScaler
    tensors: Tensors
    ema: Any = None


def params_numpy(objs: Objects) -> dict[str, np.ndarray]:
    """The parameters as NumPy arrays in their own dtype, by neutral name."""
    # trainable and frozen ones (a torch module keeps them apart); collective if FSDP shards them
    return whole({**objs.tensors.params, **objs.tensors.frozen})



def save_checkpoint(run: Run, updates_done: int, objs: Objects, device: torch.device,
                    val_loss: float | None = None, plateau: dict[str, Any] | None = None) -> Path | None:
    """Write the checkpoint after `updates_done` updates (see the module docstring): the weights as
    they are between updates (a schedule-free optimizer's evaluation point x), reduce_on_plateau's
    state in its neutral form when the run has one, and the EMA ([ema]). Collective: every rank
    calls it (the generators are gathered); rank 0's path, else None."""
    # `plateau`: reduce_on_plateau's neutral state as JSON; the EMA is objs.ema
    to_eval_point(objs.optimizer, None)  # at x already (the optimizer remembers): nothing moves
    return _save(run, updates_done, objs, device, val_loss, plateau)


def _save(run: Run, updates_done: int, objs: Objects, device: torch.device, val_loss: float | None,
          plateau: dict[str, Any] | None) -> Path | None:
    rng, rng_meta = capture_rng(device)
    per_rank = ddp.gather_rng(rng, rng_meta, run.world_size, device)
    sharded = _fsdp.is_sharded(objs.model)
    if sharded:  # every rank writes its own slices (format 3): nothing is gathered
        return _save_sharded(run, updates_done, objs, device, val_loss, plateau, per_rank)
    weights = whole(objs.tensors.all())
    if not run.is_main:
        return None
    tensors, meta_rng = pack_rank_rng(per_rank)
    opt = export_state(objs.optimizer)
    scale = objs.scaler.state_dict() if objs.scaler.enabled else None
    meta = records.checkpoint_meta(run, updates_done, opt["step"], scale, meta_rng, plateau)
    return records.save(run, updates_done, weights, opt["state"], tensors, meta, versions=_versions(),
                        val_loss=val_loss, ema=export_ema(objs.ema))


def _save_sharded(run: Run, updates_done: int, objs: Objects, device: torch.device, val_loss: float | None,
                  plateau: dict[str, Any] | None, per_rank: list[Any]) -> Path:
    pieces = _shards.local_pieces(objs.tensors.all(), objs.optimizer)
    tensors, meta = {}, {}
    if run.is_main:
        tensors, meta_rng = pack_rank_rng(per_rank)
        step = max((int(v[0]) for k, v in pieces.items() if k.startswith("optimizer/") and k.endswith("/step")),
                   default=0)
        scale = objs.scaler.state_dict() if objs.scaler.enabled else None
        meta = records.checkpoint_meta(run, updates_done, step, scale, meta_rng, plateau)
    return records.save_sharded(run, updates_done, pieces, tensors, meta, _versions(),
                                lambda data: ddp.gather_bytes(data, run.world_size, device), val_loss)


def whole(tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    """Whole tensors as NumPy in their own dtype (collective where FSDP shards them: every rank calls)."""
    return {name: native_numpy(_fsdp.full(t.detach())) for name, t in tensors.items()}


def load_tensors(tensors: dict[str, Any], saved: dict[str, np.ndarray]) -> None:
    """Copy a checkpoint's whole tensors into the model's (sharded ones keep their shard). Names,
    shapes and dtypes must match exactly, else CheckpointError naming the first, nothing changed."""
    check_tensors({n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()}, saved)
    with torch.no_grad():
        for name, t in tensors.items():
            arr = np.array(saved[name], order="C")  # a copy; ascontiguousarray would make a scalar 1-d
            src = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16) \
                if arr.dtype.name == "bfloat16" else torch.from_numpy(arr)
            t.copy_(_fsdp.like(src.to(t.device), t))


def capture_rng(device: torch.device) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """This rank's generators: Python, NumPy, torch CPU and the rank's own CUDA device only
    (ref_torch.checkpoint.capture_rng reads every device, which would open a CUDA context on each
    GPU from every rank of a multi-GPU node)."""
    tensors, meta = capture_host_rng()
    tensors["torch_cpu"] = torch.get_rng_state().numpy().copy()
    if device.type == "cuda":
        tensors[f"torch_cuda_{device.index}"] = torch.cuda.get_rng_state(device).numpy().copy()
    return tensors, meta


def _versions() -> dict[str, Any]:
    info = describe()
    return {"torch": info["torch"], "cuda": str(info["cuda"])}


def restore(checkpoint: Checkpoint, objs: Objects, rank: int) -> SkipState:
    """Put a checkpoint's state into the objects (RNG last: nothing may draw after it). Returns the
    skip counters."""
    sharded = _fsdp.is_sharded(objs.model)
    state, meta = (checkpoint if sharded else whole_checkpoint(checkpoint)).state, checkpoint.state.meta or {}
    where = checkpoint.path
    # a user's model: its trainable parameters, which only the live model knows, all have their state
    check_optimizer_entries(where / "optimizer.safetensors", objs.tensors.params, state.optimizer or {},
                            int(meta.get("optimizer_step", 0)))
    to_eval_point(objs.optimizer, None)  # the saved weights are a schedule-free optimizer's x
    if sharded:  # each rank reads only its rows, from a checkpoint of any layout and world size
        named = objs.tensors.all()
        check_tensors({n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named.items()},
                      state.model)
        _shards.load_model(named, state.model)
        _shards.load_optimizer(objs.optimizer, meta.get("optimizer_step", 0), state.optimizer or {})
    else:
        load_tensors(objs.tensors.all(), state.model)
        import_state(objs.optimizer, {"step": meta.get("optimizer_step", 0), "state": state.optimizer or {}})
    # a schedule-free optimizer stays at x, as between any two updates: the next update forms y
    release(checkpoint)  # the tensor files read: their memory
    if objs.ema is not None:
        import_ema(objs.ema, state.ema)
    if objs.scaler.enabled:
        saved = meta.get("loss_scale")
        if not isinstance(saved, dict):
            raise CheckpointError(f"{where}: state.json has no loss_scale, but this run scales the loss dynamically")
        objs.scaler.load_state_dict(saved)
    counters = meta.get("counters", {})
    skips = SkipState(int(counters.get("skipped_total", 0)), int(counters.get("consecutive_skips", 0)))
    mine = unpack_rank_rng(state.rng or {}, meta.get("rng") or {}, rank)
    if mine is not None:
        restore_rng(*mine)
    return skips


def restore_plateau(checkpoint: Checkpoint, scheduler: MetricPlateau) -> None:
    """Put the checkpoint's reduce_on_plateau state (conformance.rules.plateau) into the scheduler."""
    groups = len(scheduler.optimizer.param_groups)
    plateau_from_neutral(scheduler, plateau.from_meta(checkpoint.state.meta or {}, groups, str(checkpoint.path)))
