"""Schedule-free AdamW and SGD (facebookresearch `schedulefree`), with twinstep's per-parameter counts.

The package's AdamWScheduleFree / SGDScheduleFree update (y and z only: the parameter is the
gradient point y, the average x is implicit), written over twinstep's per-parameter counts: the
package counts updates per parameter group, twinstep per parameter as torch.optim does (equal
when every parameter has a gradient). The evaluation point is x = (y − (1−β)·z)/β (torch's
lerp(y, z, 1 − 1/β), the package's eval()), the gradient point y = lerp(x, z, 1 − β) (its
train()); the round trip rounds, so the trainers hold x between updates and move to y and back at
each update, which keeps a resumed run bit for bit. `weight_sum` and `lr_max` are 0-d states
(float64 for float64 parameters, else float32). Equations: conformance/oracle/optimizers.py.
"""

# torch.optim.Optimizer classes over ref_torch._elementwise.Foreach: `eval()` moves the parameters
# to x in place, `train()` back to y, as the package's optimizer.eval() / .train() do.

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from conformance.errors import InputError
from ref_torch._elementwise import Foreach


def beta(group: Mapping[str, Any]) -> Any:
    """The interpolation weight of y between x and z for one parameter group: β1 (adamw) or
    momentum (sgd)."""
    return group["betas"][0] if "betas" in group else group["momentum"]


class ScheduleFree(Foreach):
    """The common part: averaging weights, warm-up, the y and z sequences, train()/eval() switches."""

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        self.train_mode = True  # parameters hold y; eval() switches them to x

    def _init_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        scalar = torch.float64 if p.dtype == torch.float64 else torch.float32  # as NAdam's mu_product
        return {"z": p.detach().clone(memory_format=torch.preserve_format),
                "weight_sum": torch.zeros((), dtype=scalar), "lr_max": torch.zeros((), dtype=scalar)}

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
        b, wd, warmup = beta(group), group["weight_decay"], group["warmup_steps"]
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
            p.lerp_(s["z"], c)
            p.add_(u, alpha=lr * (b * (1 - c) - 1))
            s["z"].sub_(u, alpha=lr)

    @torch.no_grad()
    def _switch(self, to_x: bool) -> None:
        for group in self.param_groups:
            b = beta(group)
            for p in group["params"]:
                if "z" in self.state.get(p, {}):
                    p.lerp_(self.state[p]["z"], 1 - 1 / b if to_x else 1 - b)
        self.train_mode = not to_x

    def eval(self) -> None:
        """Parameters ← x = lerp(y, z, 1 − 1/β), the point to evaluate and save (optimizer.eval())."""
        if self.train_mode:
            self._switch(to_x=True)

    def train(self) -> None:
        """Parameters ← y = lerp(x, z, 1 − β), the gradient point (schedulefree's optimizer.train())."""
        if not self.train_mode:
            self._switch(to_x=False)


class ScheduleFreeAdamW(ScheduleFree):
    """schedulefree.AdamWScheduleFree: u = g/(√(v/(1−β2ᵗ)) + ε) + wd·y, y ← lerp(y, z, c) +
    lr_t·(β1·(1−c) − 1)·u, z ← z − lr_t·u."""

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
    """schedulefree.SGDScheduleFree: u = g + wd·y, y ← lerp(y, z, c) + lr_t·(μ·(1−c) − 1)·u, z ← z − lr_t·u."""

    def __init__(self, params: Any, lr: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0,
                 warmup_steps: int = 0, r: float = 0.0, weight_lr_power: float = 2.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "warmup_steps": warmup_steps, "r": r, "weight_lr_power": weight_lr_power})


# each schedule-free optimizer's implementation by its name in conformance.config.optimizer
OPTIMIZERS = {"schedule_free_adamw": ScheduleFreeAdamW, "schedule_free_sgd": ScheduleFreeSGD}
