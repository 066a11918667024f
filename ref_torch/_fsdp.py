"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for the torch trainer: `[run] parallel = "fsdp"`.

Every parameter becomes a DTensor sharded on dim 0 over the ranks (one FSDP unit per gpt block
or mlp Linear, plus the root), so parameters, gradients and optimizer state take 1/N of the memory.
Gradients are reduce-scattered (averaged, as DDP) after the window's last micro-batch
(set_requires_gradient_sync off for the others). The update path works on each rank's local
shards: the finite check and the norm are reduced over the ranks, clipping scales the shards.

Checkpoints are the neutral format's sharded layout (format 3, ref_torch._shards): every rank
writes its own rows of every parameter and optimizer state and reads back only the rows it holds,
whatever world size wrote them; nothing is gathered to rank 0. torch.distributed.checkpoint is not
used: its metadata and non-tensor entries are pickles (docs/training.md). `clip.per_parameter`
reduces a vector of per-parameter shard norms (`global_norm`); `run.compile` compiles the sharded
module's forward (FSDP2's hooks run around the compiled graph).
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

try:  # builds without torch.distributed have no DTensor: nothing can be sharded there
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover
    DTensor = type("DTensor", (), {})  # type: ignore[misc,assignment]

from conformance.config import Config
from conformance.errors import ConfigError
from ref_torch.models import GPT, MLP, LinearModel


def check(config: Config) -> None:
    """What FSDP here does not support, as ConfigError before anything runs: Prodigy, whose d sums
    over every parameter while a rank holds only its shards (clip.per_parameter reduces each
    parameter's shard norms over the ranks, run.compile compiles the sharded module's forward)."""
    if config.optimizer.name == "prodigy":
        raise ConfigError("optimizer.name = 'prodigy' with run.parallel = 'fsdp' is not supported yet (its d sums "
                          "over every parameter and a rank holds only its shards); use run.parallel = 'ddp'")


def units_of(model: torch.nn.Module, patterns: list[str] | None = None) -> list[torch.nn.Module]:
    """The FSDP units below the root: each gpt block / mlp Linear of the built-in models; of a user's
    module the submodules whose `named_modules()` name matches a pattern of `[model] fsdp_units`
    (shell globs, `*` matching dots too), by default every top-level child that holds parameters."""
    if isinstance(model, GPT):
        return list(model.transformer.h)
    if isinstance(model, (LinearModel, MLP)):
        return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model]
    if patterns is None:
        return [m for m in model.children() if any(True for _ in m.parameters())]
    named = [(n, m) for n, m in model.named_modules() if n]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in named):
            raise ConfigError(f"model.fsdp_units: {pattern!r} matches no submodule (named_modules() names)")
    return [m for n, m in named if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def shard(model: torch.nn.Module, patterns: list[str] | None = None) -> torch.nn.Module:
    """fully_shard each unit (units_of), then the root (which keeps the gpt's tied embedding)."""
    from torch.distributed.fsdp import fully_shard

    for unit in units_of(model, patterns):
        fully_shard(unit)
    fully_shard(model)
    return model


def is_sharded(model: Any) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def no_sync(model: Any) -> Callable[[], Any]:
    """The accumulation window's micro-batches but the last: gradients stay local and unreduced."""

    @contextlib.contextmanager
    def ctx() -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return ctx


def local(grads: Mapping[str, Any]) -> dict[str, Any]:
    """This rank's shard of every gradient (views: unscaling and clipping them changes the gradient)."""
    return {k: (g.to_local() if isinstance(g, DTensor) else g) for k, g in grads.items()}


def all_finite(flag: Any) -> Any:
    """True on every rank only when every rank's shards are finite (MIN all-reduce)."""
    out = torch.as_tensor(flag).to(torch.int32).reshape(1).clone()
    dist.all_reduce(out, op=dist.ReduceOp.MIN)
    return out[0] > 0


def global_norm(norm: Any, norm_type: float) -> Any:
    """The norm over every rank's shards from this rank's shard norm (or a vector of them, one per
    parameter: clip.per_parameter), in one all-reduce."""
    out = norm.to(torch.float64).reshape(-1).clone()
    if math.isinf(norm_type):
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
    else:
        out = out ** norm_type
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        out = out ** (1.0 / norm_type)
    return out.reshape(norm.shape).to(norm.dtype)


def full(t: Any) -> Any:
    """The whole tensor of a sharded one (collective), else the tensor itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def like(src: Any, target: Any) -> Any:
    """A whole tensor as `target` holds it: this rank's shard when `target` is sharded."""
    return distribute_tensor(src, target.device_mesh, target.placements) if isinstance(target, DTensor) else src
