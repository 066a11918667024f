"""AdEMAMix (Pagliardini et al. 2024, "The AdEMAMix Optimizer: Better, Faster, Older"), as the
paper's reference code (apple/ml-ademamix, its torch class) computes it: Adam's fast EMA m and a
slow EMA m_slow of the gradients, mixed as (m/(1−β1ᵗ) + α·m_slow) / (√v/√(1−β2ᵗ) + ε), with weight
decay added to that update before the step, p ← p − lr·(u + wd·p). α and β3 may warm up over the
parameter's update count t (1 at its first update): α linearly from 0 (`alpha_warmup` updates),
β3 from β1 linearly in the EMA's half-life (`beta3_warmup` updates); 0 is the reference's None
(no warm-up). Equations: conformance/oracle/optimizers.py.
"""

# torch: a torch.optim.Optimizer over ref_torch._elementwise.Foreach, with the reference's state
# names (exp_avg_fast, exp_avg_slow, exp_avg_sq) and a float `step` tensor per parameter.

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ref_torch._elementwise import Foreach


def alpha_at(group: Mapping[str, Any], t: Any) -> Any:
    """α at update t: α·t/alpha_warmup during the warm-up (the reference's linear_warmup_scheduler
    from 0), then α."""
    warmup = group["alpha_warmup"]
    return t / warmup * group["alpha"] if t < warmup else group["alpha"]


def beta3_at(group: Mapping[str, Any], t: Any) -> Any:
    """β3 at update t: during the warm-up the β whose half-life is the linear blend of β1's and β3's,
    f(β) = ln ½ / ln(β + 10⁻⁸) − 1, β = ½^(1/(f + 1)) (the reference's linear_hl_warmup_scheduler);
    then β3."""
    warmup, b1, b3 = group["beta3_warmup"], group["betas"][0], group["beta3"]
    if not t < warmup:
        return b3
    a = t / warmup
    blend = (1 - a) * (math.log(0.5) / math.log(b1 + 1e-8) - 1) + a * (math.log(0.5) / math.log(b3 + 1e-8) - 1)
    return 0.5 ** (1 / (blend + 1))


class AdEMAMix(Foreach):
    """AdEMAMix with apple/ml-ademamix's names and defaults; its betas (β1, β2, β3) are `betas` and
    `beta3` here."""

    STATE = ("exp_avg_fast", "exp_avg_slow", "exp_avg_sq")

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 beta3: float = 0.9999, alpha: float = 2.0, beta3_warmup: int = 0, alpha_warmup: int = 0,
                 eps: float = 1e-8, weight_decay: float = 0.0, *, maximize: bool = False,
                 foreach: bool | None = None) -> None:
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not all(0.0 <= b < 1.0 for b in (*betas, beta3)):
            raise ValueError(f"Invalid betas: {betas}, beta3 {beta3}")
        if not alpha >= 0.0:
            raise ValueError(f"Invalid alpha value: {alpha}")
        self.foreach = foreach  # None: foreach kernels on CUDA, a loop over tensors elsewhere (torch.optim's rule)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "beta3": beta3, "alpha": alpha,
                                  "beta3_warmup": beta3_warmup, "alpha_warmup": alpha_warmup, "eps": eps,
                                  "weight_decay": weight_decay, "maximize": maximize})

    def _update(self, group, params, grads, states):
        b1, b2 = group["betas"]
        by_step: dict[float, list[int]] = {}
        for i, s in enumerate(states):  # the warm-ups make α and β3 scalars of t: one foreach call per t
            by_step.setdefault(s["step"].item(), []).append(i)  # step lives on the CPU: no device sync
        foreach = self.foreach if self.foreach is not None else all(p.is_cuda for p in params)
        # foreach: few kernel launches; one tensor at a time: each temporary freed at once (faster on a CPU)
        chunks = list(by_step.items()) if foreach else [(t, [i]) for t, at in by_step.items() for i in at]
        for t, at in chunks:
            p, g = [params[i] for i in at], [grads[i] for i in at]
            fast, slow, sq = ([states[i][name] for i in at] for name in self.STATE)
            b3 = beta3_at(group, t)
            torch._foreach_mul_(fast, b1)
            torch._foreach_add_(fast, g, alpha=1 - b1)
            torch._foreach_mul_(sq, b2)
            torch._foreach_addcmul_(sq, g, g, 1 - b2)
            torch._foreach_mul_(slow, b3)
            torch._foreach_add_(slow, g, alpha=1 - b3)
            denom = torch._foreach_sqrt(sq)
            torch._foreach_div_(denom, math.sqrt(1 - b2 ** t))
            torch._foreach_add_(denom, group["eps"])
            u = torch._foreach_div(fast, 1 - b1 ** t)
            torch._foreach_add_(u, slow, alpha=alpha_at(group, t))
            if group["weight_decay"] == 0:
                torch._foreach_addcdiv_(p, u, denom, value=-group["lr"])
                continue
            torch._foreach_div_(u, denom)
            torch._foreach_add_(u, p, alpha=group["weight_decay"])
            torch._foreach_add_(p, u, alpha=-group["lr"])


OPTIMIZERS = {"ademamix": AdEMAMix}
