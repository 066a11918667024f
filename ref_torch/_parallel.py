"""Data parallelism for the trainer: the processes of a torchrun launch joined (`setup`) and left
(`teardown`), and how gradients, counts, losses and checkpoint bytes meet across them.

One process per rank under torchrun; gloo carries the CPU's collectives. The global batch is the
world size (processes) × data.batch_size × accumulation.steps, whatever each process's device
count. ref_torch uses torch.distributed (DDP, or FSDP2's shards; NCCL on CUDA, one device per
process); ref_jax one jax.sharding Mesh over every process's devices, where XLA all-reduces the
gradient sums inside the compiled step.
"""

# The torch side, torch.distributed glue: process group, DDP, count/loss reductions, RNG gathering.
#
# One process per rank (torchrun). Gloo on the CPU, NCCL on CUDA. Rank 0 writes every file; the
# other ranks take part in the collectives (gradients through DDP, window counts, the logged loss,
# evaluation sums, and the RNG states rank 0 puts into each checkpoint).

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import sys
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from conformance.checkpoint import files as io
from conformance.errors import ConfigError


def setup(rank: int, world_size: int, device: torch.device) -> bool:
    """Join the processes of a torchrun launch (True when this call joined them and must call
    teardown); one process, or a group already joined: nothing to do."""
    if world_size == 1 or (dist.is_available() and dist.is_initialized()):
        if world_size > 1 and dist.get_world_size() != world_size:
            raise ConfigError(f"world_size = {world_size}, but the process group has {dist.get_world_size()} ranks")
        return False
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"world_size = {world_size} needs a launcher: {missing[0]} is not set "
                          f"(start with torchrun --nproc_per_node {world_size} -m conformance train ...)")
    backend = "nccl" if device.type == "cuda" else "gloo"
    _import_parallel_modules()
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)
    return True


def _import_parallel_modules() -> None:
    """Import DDP's and FSDP's modules before the process group exists.

    torch.distributed.nn.functional (pulled in by DDP) and fsdp.sharded_grad_scaler bind
    `group.WORLD` as default arguments when first imported; imported after init_process_group they
    hold the group forever, so destroy_process_group cannot free it, its gloo threads outlive the
    run and the process can abort at exit ("terminate called without an active exception").
    """
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.fsdp.sharded_grad_scaler  # noqa: F401
    import torch.distributed.nn.functional  # noqa: F401
    import torch.distributed.tensor  # noqa: F401
    import torch.nn.parallel.distributed  # noqa: F401


def _release_dtensor_caches() -> None:
    """Empty DTensor's caches (FSDP2 fills them): sharding propagation, redistribution plans and
    mesh topology are memoized on keys that hold the DeviceMesh, whose registry holds the process
    group, so without this the group outlives destroy_process_group."""
    tensor_modules = [m for name, m in list(sys.modules.items())
                      if name.startswith("torch.distributed.tensor") and m is not None]
    if not tensor_modules:
        return
    from torch.distributed.tensor import debug

    debug._clear_sharding_prop_cache()  # the Python cache and the C++ fast path's
    for module in tensor_modules:
        for obj in list(vars(module).values()):
            for fn in [obj, *(vars(obj).values() if isinstance(obj, type) else ())]:
                fn = getattr(fn, "__func__", fn)  # staticmethod / classmethod
                if isinstance(fn, functools._lru_cache_wrapper):
                    fn.cache_clear()
    planners = getattr(sys.modules.get("torch.distributed.tensor._redistribute"), "clear_redistribute_planner_cache",
                       None)
    if planners is not None:
        planners()


def teardown(created: bool) -> None:
    """Leave the processes this run joined (`created`: setup's answer), leaving nothing behind that
    keeps them alive past the run."""
    # nothing may keep the process group (and its gloo or NCCL threads) alive: a group that outlives
    # the run is torn down during interpreter exit, where it can abort a finished run
    if created and dist.is_initialized():
        _release_dtensor_caches()
        gc.collect()  # FSDP2's modules and meshes sit in reference cycles
        dist.destroy_process_group()


def barrier(world_size: int) -> None:
    if world_size > 1:
        dist.barrier()


def wrap(model: torch.nn.Module, device: torch.device, world_size: int, parallel: str = "ddp",
         units: list[str] | None = None) -> Any:
    """The module the forward pass goes through: DDP over the model, or the model itself sharded in
    place by FSDP2 (ref_torch._fsdp; `units`: [model] fsdp_units), or the model itself on one
    process. Gradients are averaged over ranks either way. Build the optimizer after this (FSDP
    replaces the parameters)."""
    if world_size == 1:
        return model
    if parallel == "fsdp":
        from ref_torch import _fsdp

        return _fsdp.shard(model, units)
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def sum_over_ranks(x: Any, device: torch.device) -> Any:
    """The element-wise sum of a tensor over all ranks (a new tensor on `device`)."""
    out = torch.as_tensor(x).to(device=device, dtype=torch.float64, non_blocking=True).clone()  # no wait for the device
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


class World:
    """What the world of one update is and how it reduces: apply_update's parallel context. One
    process reduces nothing. Under DDP the window's token count is summed over the ranks and the
    logged loss averaged, and gradients synchronize once per window (no_sync for the micro-batches
    before the last). Under FSDP (`sharded`) an update works on this rank's shards of the gradients,
    and the ranks' finite flags and norms are combined, so every rank takes the same decision."""

    def __init__(self, size: int = 1, device: torch.device | None = None, model: Any = None) -> None:
        from ref_torch import _fsdp  # DTensor's imports only for a run that uses them

        self.size = size
        self.device = device
        self.model = model
        self.sharded = size > 1 and _fsdp.is_sharded(model)

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def reduce_count(self, n: Any) -> Any:
        """The window's token count summed over ranks, divided by the world size because DDP
        averages (rather than sums) the ranks' gradients."""
        return sum_over_ranks(n, self.device) / self.size

    def no_sync(self) -> Any:
        """The context of every micro-batch but the window's last: gradients stay local."""
        from ref_torch import _fsdp

        return _fsdp.no_sync(self.model)() if self.sharded else self.model.no_sync()

    def reduce_loss(self, loss: Any) -> Any:
        """The logged window loss: the mean of the ranks' contributions (each normalized globally)."""
        out = loss.detach().to(torch.float64).clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / self.size

    def local_grads(self, grads: Any) -> Any:
        """This rank's part of the gradients: its shards under FSDP, else the gradients themselves."""
        from ref_torch import _fsdp

        return _fsdp.local(grads) if self.sharded else grads

    def reduce_finite(self, flag: Any) -> Any:
        """True on every rank only when every rank's shards are finite (sharded; else `flag`)."""
        from ref_torch import _fsdp

        return _fsdp.all_finite(flag) if self.sharded else flag

    def reduce_norm(self, norm: Any, norm_type: float) -> Any:
        """The norm over every rank's shards from this rank's (sharded; else `norm`)."""
        from ref_torch import _fsdp

        return _fsdp.global_norm(norm, norm_type) if self.sharded else norm


def gather_bytes(data: bytes, world_size: int, device: torch.device) -> list[bytes]:
    """Every process's bytes, in rank order, on every process (one process: [data])."""
    # as tensors only: no pickle
    if world_size == 1:
        return [data]
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8, device=device)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else buf[:0]
    bufs = [torch.zeros_like(buf) for _ in range(world_size)]
    dist.all_gather(bufs, buf)
    return [bytes(b[: int(s.item())].cpu().numpy().tobytes()) for b, s in zip(bufs, sizes)]


def gather_rng(tensors: dict[str, np.ndarray], meta: dict[str, Any], world_size: int,
               device: torch.device) -> list[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    """Every rank's (RNG tensors, RNG meta), in rank order (safetensors + JSON over the wire)."""
    if world_size == 1:
        return [(tensors, meta)]
    blob = io.encode_tensors(tensors, "rng")
    header = json.dumps(meta).encode("utf-8")
    payload = len(header).to_bytes(8, "little") + header + blob
    out = []
    for i, data in enumerate(gather_bytes(payload, world_size, device)):
        n = int.from_bytes(data[:8], "little")
        where = f"rank {i} RNG state"
        out.append((io.decode_tensors(data[8 + n:], where), json.loads(data[8:8 + n].decode("utf-8"))))  # type: ignore[arg-type]
    return out


@contextlib.contextmanager
def finally_teardown(created: bool) -> Any:
    """Destroy the process group this run created, whatever happens."""
    try:
        yield
    except BaseException:
        teardown(created)
        raise
    # every rank leaves its last collective before the group goes: destroying it under a peer's
    # pending gloo work can abort that process at exit
    if created and dist.is_initialized():
        dist.barrier()
    teardown(created)


def agree(ok: bool, world_size: int) -> bool:
    """True when every rank reports ok (a MIN all-reduce); one process: ok itself."""
    if world_size == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
