"""Sharded checkpoints under FSDP2: every rank saves and restores only its own slices.

Save: each rank's local shard of every parameter (DTensor `to_local()`, Shard(0) over a 1-D mesh:
rows `dim0_slice(n, rank, world)`) and of every optimizer state shaped like it goes to its own
file; 0-d states (step, ...) and unsharded tensors are written once, by rank 0
(conformance.checkpoint.save_sharded: no tensor is gathered; only file tables travel). Restore:
each rank reads the rows it holds now from the files that have them, whatever world size wrote
the checkpoint (`ShardedTensor.read`), or slices a whole-layout checkpoint's tensors, and builds
its DTensors from them (`DTensor.from_local`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

try:  # builds without torch.distributed have no DTensor: nothing is sharded there
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # pragma: no cover
    DTensor = type("DTensor", (), {})  # type: ignore[misc,assignment]
    Shard = None  # type: ignore[assignment]

from conformance.checkpoint import dim0_slice
from conformance.errors import CheckpointError
from ref_torch._assembly import neutral_names
from ref_torch.optimizers import import_state

Piece = tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]


def _rows(t: Any) -> tuple[int, int] | None:
    """This rank's rows of a Shard(0) DTensor, else None (replicated or not a DTensor)."""
    if not isinstance(t, DTensor) or t.ndim == 0:
        return None
    if len(t.placements) != 1 or t.placements[0] != Shard(0):
        raise CheckpointError(f"a sharded checkpoint needs Shard(0) over one mesh dimension; found {t.placements}")
    mesh = t.device_mesh
    start, stop = dim0_slice(t.shape[0], mesh.get_local_rank(), mesh.size())
    if t.to_local().shape[0] != stop - start:
        raise CheckpointError(f"a local shard has {t.to_local().shape[0]} rows; torch.chunk's rule gives "
                              f"{stop - start}")
    return start, stop


def _piece(value: Any, like: Any) -> Piece:
    """(this rank's box, the global shape, its start) of `value`, sharded as `like` when it is."""
    rows = _rows(like) if isinstance(value, DTensor) else None
    local = value.to_local() if isinstance(value, DTensor) else value
    arr = local if isinstance(local, np.ndarray) else _host_view(local.detach())
    if rows is None:
        return arr, tuple(arr.shape), (0,) * arr.ndim
    shape = tuple(value.shape)
    return arr, shape, (rows[0],) + (0,) * (len(shape) - 1)


def _host_view(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as NumPy without a copy on the CPU (the save streams them to its file
    synchronously, before training touches them again)."""
    t = t.cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def local_pieces(tensors: Mapping[str, Any], optimizer: Any) -> dict[str, Piece]:
    """This rank's pieces of the model ("model/<name>") and optimizer state ("optimizer/<p>/<s>",
    export_state's neutral names and rules: parameters never stepped have none, `step` as int64),
    viewed, not copied."""
    pieces = {f"model/{name}": _piece(t.detach(), t) for name, t in tensors.items()}
    for group in optimizer.param_groups:
        names = neutral_names(group["optimizer_name"], group)
        for pname, p in zip(group["param_names"], group["params"]):
            st = optimizer.state.get(p, {})
            if not st or float(st.get("step", 0)) == 0:
                continue
            for key, value in st.items():
                if value is None or key not in names:
                    continue
                name = f"optimizer/{pname}/{names[key]}"
                if key == "step":
                    pieces[name] = (np.asarray(int(value), np.int64), (), ())
                elif isinstance(value, DTensor) and tuple(value.shape) == tuple(p.shape):
                    pieces[name] = _piece(value, p)
                else:
                    arr = _host_view(value.full_tensor() if isinstance(value, DTensor) else value.detach())
                    pieces[name] = (arr, tuple(arr.shape), (0,) * arr.ndim)
    return pieces


def _read(saved: Any, rows: tuple[int, int] | None) -> np.ndarray:
    if rows is None:
        return np.asarray(saved)
    if getattr(saved, "lazy", False):
        return saved.read((slice(*rows),))
    return np.asarray(saved)[rows[0]:rows[1]]


def _torch(arr: np.ndarray) -> torch.Tensor:
    import ml_dtypes

    arr = np.array(arr, order="C")
    return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16) if arr.dtype == ml_dtypes.bfloat16 \
        else torch.from_numpy(arr)


def load_model(tensors: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    """Each rank copies its rows of every tensor from the checkpoint (names, shapes and dtypes
    checked before, conformance.checkpoint.check_tensors)."""
    with torch.no_grad():
        for name in sorted(tensors):
            t = tensors[name]
            rows = _rows(t)
            target = t.to_local() if isinstance(t, DTensor) else t
            target.copy_(_torch(_read(saved[name], rows)).to(target.device))


def load_optimizer(optimizer: Any, step: int, saved: Mapping[str, Mapping[str, Any]]) -> None:
    """import_state over this rank's local shards (each rank reads only its rows), then every
    local state shaped like its local parameter becomes a DTensor sharded as the parameter."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    local = {id(p): p.to_local() if isinstance(p, DTensor) else p for p in params}
    groups = [dict(g, params=[local[id(p)] for p in g["params"]]) for g in optimizer.param_groups]
    entries: dict[str, dict[str, Any]] = {}
    by_name = {n: p for g in optimizer.param_groups for n, p in zip(g["param_names"], g["params"])}
    for pname in sorted(saved):
        p = by_name.get(pname)
        rows = _rows(p) if p is not None else None
        entries[pname] = {k: _read(v, rows if tuple(np.shape(v)) == tuple(p.shape) else None)
                          for k, v in sorted(saved[pname].items())}
    shell = SimpleNamespace(param_groups=groups, state={})
    import_state(shell, {"step": step, "state": entries})
    optimizer.state.clear()
    for p in params:
        lp = local[id(p)]
        if lp not in shell.state:
            continue
        state = {}
        for key, value in shell.state[lp].items():
            if isinstance(p, DTensor) and isinstance(value, torch.Tensor) and value.ndim and value.shape == lp.shape:
                value = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                           stride=p.stride())
            state[key] = value
        optimizer.state[p] = state
