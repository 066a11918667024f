"""Schedule-free AdamW and SGD for ref_torch (facebookresearch `schedulefree`), per-parameter counts.

The package's reference formulation (adamw_schedulefree_reference.py, sgd_schedulefree_reference.py)
with the average x kept in the state, so that switching between the training point y (the
parameter during training) and the evaluation point x is exact in both directions:
`eval()` copies x into the parameters, `train()` recomputes y = β·x + (1−β)·z with the very
operations `step()` uses. The package's own AdamWScheduleFree keeps y and z only and reaches x by
interpolation (ulp-level differences); and it counts updates per parameter group, where twinstep
counts them per parameter as torch.optim does (equal when every parameter has a gradient). The
equations are those of conformance/oracle/optimizers.py.
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.errors import InputError
from ref_torch._elementwise import _Foreach


def _scalar_dtype(p: torch.Tensor) -> torch.dtype:
    # weight_sum and lr_max: 0-d tensors, float64 for float64 parameters (as NAdam's mu_product)
    return torch.float64 if p.dtype == torch.float64 else torch.float32


class ScheduleFree(_Foreach):
    """The common part: averaging weights, warm-up, z/x/y sequences, train()/eval() swaps."""

    BETA = "momentum"

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        self.train_mode = True  # parameters hold y; eval() switches them to x

    def _init_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        scalar = _scalar_dtype(p)
        return {"z": p.detach().clone(memory_format=torch.preserve_format),
                "x": p.detach().clone(memory_format=torch.preserve_format),
                "weight_sum": torch.zeros((), dtype=scalar), "lr_max": torch.zeros((), dtype=scalar)}

    def _beta(self, group: dict[str, Any]) -> float:
        return group["betas"][0] if self.BETA == "betas" else group["momentum"]

    def _direction(self, group: dict[str, Any], g: torch.Tensor, state: dict[str, Any], t: float) -> torch.Tensor:
        return g

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Perform a single optimization step (closure: re-evaluates the model, returns the loss)."""
        if not self.train_mode:
            raise InputError("the schedule-free optimizer is in eval mode (parameters at x); call train() "
                             "before step()")
        return super().step(closure)

    def _update(self, group, params, grads, states):
        beta, wd, warmup = self._beta(group), group["weight_decay"], group["warmup_steps"]
        for p, g, s in zip(params, grads, states):
            t = s["step"].item()
            lr = group["lr"] * (t / warmup if t - 1 < warmup else 1.0)
            lr_max = max(s["lr_max"].item(), lr)
            weight = t ** group["r"] * lr_max ** group["weight_lr_power"]
            s["weight_sum"] += weight
            s["lr_max"].fill_(lr_max)
            total = s["weight_sum"].item()
            c = weight / total if total != 0 else 0.0
            u = self._direction(group, g, s, t)
            if wd != 0:
                u = u.add(p, alpha=wd)  # the decay is taken at y, the parameter in training
            s["z"].add_(u, alpha=-lr)
            s["x"].mul_(1 - c).add_(s["z"], alpha=c)
            p.copy_(self._point(s, beta))

    @staticmethod
    def _point(s: dict[str, Any], beta: float) -> torch.Tensor:
        return s["x"].mul(beta).add_(s["z"], alpha=1 - beta)

    @torch.no_grad()
    def eval(self) -> None:
        """Parameters ← x, the point to evaluate and save (schedulefree's optimizer.eval())."""
        for group in self.param_groups:
            for p in group["params"]:
                if "x" in self.state.get(p, {}):
                    p.copy_(self.state[p]["x"])
        self.train_mode = False

    @torch.no_grad()
    def train(self) -> None:
        """Parameters ← y = β·x + (1−β)·z, the gradient point (schedulefree's optimizer.train())."""
        for group in self.param_groups:
            beta = self._beta(group)
            for p in group["params"]:
                if "x" in self.state.get(p, {}):
                    p.copy_(self._point(self.state[p], beta))
        self.train_mode = True


class ScheduleFreeAdamW(ScheduleFree):
    """schedulefree.AdamWScheduleFree: u = g/(√(v/(1−β2ᵗ)) + ε) + wd·y, z ← z − lr_t·u, x ← (1−c)·x + c·z,
    y = β1·x + (1−β1)·z."""

    BETA = "betas"

    def __init__(self, params: Any, lr: float = 0.0025, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, warmup_steps: int = 0, r: float = 0.0,
                 weight_lr_power: float = 2.0) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "warmup_steps": warmup_steps, "r": r, "weight_lr_power": weight_lr_power})

    def _init_state(self, p, group):
        return {**super()._init_state(p, group),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}

    def _direction(self, group, g, state, t):
        b2 = group["betas"][1]
        v = state["exp_avg_sq"]
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        return g / v.div(1 - b2 ** t).sqrt_().add_(group["eps"])


class ScheduleFreeSGD(ScheduleFree):
    """schedulefree.SGDScheduleFree: u = g + wd·y, z ← z − lr_t·u, x ← (1−c)·x + c·z, y = μ·x + (1−μ)·z."""

    def __init__(self, params: Any, lr: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0,
                 warmup_steps: int = 0, r: float = 0.0, weight_lr_power: float = 2.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "warmup_steps": warmup_steps, "r": r, "weight_lr_power": weight_lr_power})


CLASSES = {"schedule_free_adamw": ScheduleFreeAdamW, "schedule_free_sgd": ScheduleFreeSGD}
