"""`[run] sync_batchnorm`: BatchNorm statistics over every process of a run.

torch.nn.SyncBatchNorm synchronizes a training micro-batch's statistics over the process group,
but its kernels are CUDA's (and XPU's, HPU's): on the CPU (gloo) it raises, and DDP refuses a CPU
module holding one. `convert` uses torch's on those devices; on the CPU it puts CpuSyncBatchNorm
in place of each BatchNorm layer, which computes the same statistics with differentiable
all-reduces (torch.distributed.nn.functional.all_reduce, whose backward all-reduces
the gradient, as torch's own backward does): the global mean first, then the global sum of squared
deviations from it, so the variance is a one-process two-pass variance of the global micro-batch.
Running statistics follow torch's rule (momentum, or the cumulative average without one; the
unbiased variance n / (n - 1)).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm


class CpuSyncBatchNorm(_BatchNorm):
    """A BatchNorm layer (any number of spatial dimensions) whose training statistics are those of
    the micro-batch over every process of the default group (gloo); torch's BatchNorm otherwise."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # the cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        return _sync_normalize(self, input, factor)


def _sync_normalize(bn: CpuSyncBatchNorm, x: torch.Tensor, factor: float) -> torch.Tensor:
    from torch.distributed.nn.functional import all_reduce

    channels = x.shape[1]
    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1, channels] + [1] * (x.dim() - 2)
    local = torch.full((1,), x.numel() // channels, dtype=x.dtype, device=x.device)
    sums = all_reduce(torch.cat([x.sum(dims), local]), op=dist.ReduceOp.SUM, group=dist.group.WORLD)
    n, mean = sums[channels], sums[:channels] / sums[channels]
    centred = x - mean.reshape(shape)
    var = all_reduce((centred * centred).sum(dims), op=dist.ReduceOp.SUM, group=dist.group.WORLD) / n
    y = centred * torch.rsqrt(var + bn.eps).reshape(shape)
    if bn.affine:
        y = y * bn.weight.reshape(shape) + bn.bias.reshape(shape)
    if bn.track_running_stats:
        with torch.no_grad():
            bn.running_mean.mul_(1.0 - factor).add_(mean.detach().to(bn.running_mean.dtype), alpha=factor)
            unbiased = var.detach() * (n / (n - 1))
            bn.running_var.mul_(1.0 - factor).add_(unbiased.to(bn.running_var.dtype), alpha=factor)
    return y


def convert(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The module with each BatchNorm1d/2d/3d synchronized: torch.nn.SyncBatchNorm off the CPU,
    CpuSyncBatchNorm on it, holding the same parameters and buffers under the same names
    (checkpoints are unchanged); a new module when `module` is itself one."""
    if device.type != "cpu":
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if isinstance(module, _BatchNorm) and not isinstance(module, (torch.nn.SyncBatchNorm, CpuSyncBatchNorm)):
        out = CpuSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
        return out
    for name, child in module.named_children():
        module.add_module(name, convert(child, device))
    return module
