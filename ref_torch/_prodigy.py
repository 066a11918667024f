"""Prodigy (Mishchenko & Defazio 2024, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner")
as prodigyopt 1.1.2's Prodigy computes it: Adam whose step size d·lr comes from one estimate d of
the distance to the solution, shared by every parameter, so that an update reads all parameters
before it moves any. The shared d, d_max, d_numerator and k sit in every parameter's state, all
equal, read from the first parameter that has been updated. Equations: conformance/oracle/prodigy.py.
"""

# torch: a torch.optim.Optimizer with prodigyopt's state names (exp_avg, exp_avg_sq, s, p0) whose
# shared scalars are 0-d tensors beside the parameters: nothing is read back to the host inside an
# update (prodigyopt reads two numbers per parameter), the early return (Σ|s| = 0) a step of 0.
# The shared scalars are computed in float64, as prodigyopt's Python floats are.

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

SHARED = ("d", "d_max", "d_numerator", "k")  # one value for the whole optimizer


def _scalar_dtype(p: torch.Tensor) -> torch.dtype:
    return torch.float64 if p.dtype == torch.float64 else torch.float32


def _work(t: torch.Tensor | None) -> Any:
    # half-precision tensors are worked on in float32 (d²·(1 − β2)·g² is below float16's range)
    return t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t


def shared_values(states: Any, cfg: Mapping[str, Any], place: Any) -> dict[str, Any]:
    """d, d_max, d_numerator and k: from the first of `states` (the parameters' states, in order)
    that holds them, else their start (float64 on torch's device `place`; JAX: of dtype `place`)."""
    values = {"d": cfg["d0"], "d_max": cfg["d0"], "d_numerator": 0.0, "k": 0.0}
    out = {key: torch.tensor(v, dtype=torch.float64, device=place) for key, v in values.items()}
    for st in reversed([s for s in states if s]):
        held = st["step"].to(place) > 0
        out = {key: torch.where(held, st[key].to(place, torch.float64), out[key]) for key in SHARED}
    return out


def _total(values: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    # a float64 sum of 0-d tensors in one kernel (prodigyopt adds Python floats)
    if not values:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack(values).to(torch.float64).sum()


class _Scalars(dict):
    # 0-d factors by (name, dtype), each computed once per update
    def of(self, name: Any, dtype: torch.dtype, make: Any) -> torch.Tensor:
        if (name, dtype) not in self:
            self[name, dtype] = make().to(dtype)
        return self[name, dtype]


class Prodigy(torch.optim.Optimizer):
    """Prodigy with prodigyopt 1.1.2's names and defaults (no slice_p: every entry counts; no
    fsdp_in_use: FSDP refuses Prodigy, DDP's ranks hold every parameter and the same sums)."""

    def __init__(self, params: Any, lr: float = 1.0, betas: tuple[float, float] = (0.9, 0.999),
                 beta3: float | None = None, eps: float = 1e-8, weight_decay: float = 0.0,
                 decouple: bool = True, use_bias_correction: bool = False,
                 safeguard_warmup: bool = False, d0: float = 1e-6, d_coef: float = 1.0,
                 growth_rate: float = math.inf) -> None:
        if not d0 > 0.0:
            raise ValueError(f"Invalid d0 value: {d0}")
        if not lr >= 0.0 or not eps >= 0.0:
            raise ValueError(f"Invalid learning rate {lr} or epsilon {eps}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Invalid betas: {betas}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "beta3": beta3, "eps": eps,
                                  "weight_decay": weight_decay, "decouple": decouple,
                                  "use_bias_correction": use_bias_correction, "safeguard_warmup": safeguard_warmup,
                                  "d0": d0, "d_coef": d_coef, "growth_rate": growth_rate})

    def _fresh(self, p: torch.Tensor, b1: float, d0: float) -> dict[str, torch.Tensor]:
        scalar = {"dtype": _scalar_dtype(p), "device": p.device}
        state = {"step": torch.zeros((), **scalar), "exp_avg_sq": torch.zeros_like(p), "s": torch.zeros_like(p),
                 "p0": p.detach().clone(), "d": torch.tensor(d0, **scalar), "d_max": torch.tensor(d0, **scalar),
                 "d_numerator": torch.zeros((), **scalar), "k": torch.zeros((), **scalar)}
        if b1 > 0:  # prodigyopt keeps no exp_avg at beta1 = 0
            state["exp_avg"] = torch.zeros_like(p)
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        first = self.param_groups[0]  # prodigyopt reads all but lr, weight_decay and eps from here
        b1, b2 = first["betas"]
        b3 = first["beta3"] if first["beta3"] is not None else math.sqrt(b2)
        d0 = first["d0"]
        items = [(group, p) for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not items:
            return loss
        device = items[0][1].device
        sh = shared_values([self.state.get(p) for g in self.param_groups for p in g["params"]], first, device)
        d, k = sh["d"], sh["k"]
        lr = max(group["lr"] for group in self.param_groups)
        bc = torch.sqrt(1 - b2 ** (k + 1)) / (1 - b1 ** (k + 1)) if first["use_bias_correction"] else 1.0
        dlr = d * lr * bc
        rate = (d / d0) * (d if first["safeguard_warmup"] else dlr)
        scalars = _Scalars()  # each 0-d factor once per dtype, not once per tensor
        dots, sums, work = [], [], []
        for group, p in items:
            state = self.state[p]
            if not state:
                state.update(self._fresh(p, b1, d0))
            for key in ("step", *SHARED):  # a loaded state may hold its scalars on the CPU
                state[key] = state[key].to(p.device)
            pw, grad = _work(p), _work(p.grad)
            m, v, s = _work(state.get("exp_avg")), _work(state["exp_avg_sq"]), _work(state["s"])
            if not group["decouple"] and group["weight_decay"] != 0:
                grad = grad.add(pw, alpha=group["weight_decay"])
            if group["lr"] > 0:  # prodigyopt moves no sum or moment of a group whose lr is 0
                dots.append(torch.dot(grad.flatten(), (_work(state["p0"]) - pw).flatten()))
                dt = grad.dtype  # the moments and sums move before prodigyopt's early return: in place
                if m is not None:
                    m.mul_(b1).addcmul_(grad, scalars.of("c1", dt, lambda: d * (1 - b1)))
                v.mul_(b2).addcmul_(grad, grad * scalars.of("c2", dt, lambda: d * d * (1 - b2)))
                s.mul_(b3).addcmul_(grad, scalars.of("rate", dt, lambda: rate))
                sums.append(torch.linalg.vector_norm(s, 1))  # Σ|s|, no temporary
            work.append((group, p, pw, state, grad, m, v, s))
        numerator = (d / d0) * dlr * _total(dots, device)
        denominator = _total(sums, device)
        go = denominator != 0  # prodigyopt returns early when Σ|s| = 0: the moments have moved, nothing else
        numerator = b3 * sh["d_numerator"] + numerator
        d_hat = first["d_coef"] * numerator / torch.where(go, denominator, 1.0)
        new_d = torch.where(d == d0, torch.maximum(d, d_hat), d)
        d_max = torch.maximum(sh["d_max"], d_hat)
        new_d = torch.minimum(d_max, new_d * first["growth_rate"])
        shared = {"d": new_d, "d_max": d_max, "d_numerator": numerator, "k": k + 1}
        shared = {key: torch.where(go, value, sh[key]) for key, value in shared.items()}
        moved = torch.where(go, dlr, 0.0)  # the step size: 0 changes nothing
        # p + m/(denom/(−dlr)): addcdiv without a Python number (dlr = 0: m/∞ = 0, p stays); β1 = 0: d·g, new d
        for group, p, pw, state, grad, m, v, s in work:
            dt, wd, eps = grad.dtype, group["weight_decay"], group["eps"]
            state["step"] += scalars.of("go", state["step"].dtype, lambda: go)
            if group["decouple"] and wd != 0:  # p + (−wd·dlr)·p, prodigyopt's add_(p, alpha=−wd·dlr)
                pw.addcmul_(pw, scalars.of(("decay", wd), dt, lambda: -wd * moved))
            denom = v.sqrt().add_(scalars.of(("eps", eps), dt, lambda: shared["d"] * eps))
            step = scalars.of(("step", m is None), dt, lambda: -moved if m is not None else -moved * shared["d"])
            pw.addcdiv_(m if m is not None else grad, denom.div_(step))
            for held, value in ((p, pw), (state.get("exp_avg"), m), (state["exp_avg_sq"], v), (state["s"], s)):
                if held is not None and value is not held:  # half precision: rounded once per update
                    held.copy_(value)
        for st in (self.state[p] for g in self.param_groups for p in g["params"] if self.state.get(p)):
            st.update({key: scalars.of(key, st[key].dtype, lambda: value) for key, value in shared.items()})
        return loss


OPTIMIZERS = {"prodigy": Prodigy}
