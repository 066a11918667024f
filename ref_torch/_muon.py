"""Muon's Newton–Schulz orthogonalisation with the working dtype as a parameter (`newton_schulz`):
the iteration torch.optim.Muon runs in bfloat16 (torch/optim/_muon.py), which `ns_dtype =
"float32" | "float64"` runs in that dtype instead; the twin's Muon update calls it.
"""

# Besides the iteration, torch.optim classes: `MuonWithFallback` is one torch.optim.Optimizer whose
# param_groups (in twinstep's group order) are shared, dict for dict and state for state, with two
# inner optimizers: torch.optim.Muon (or `FloatMuon`, the same algorithm with Newton–Schulz in
# float32/float64 instead of torch's hard-coded bfloat16) and the fallback (AdamW by default).
# Schedulers, `param_groups[i]["lr"]` edits, state_dict/load_state_dict and zero_grad see one
# optimizer, as with the built-ins.

from __future__ import annotations

from typing import Any

import torch
from torch.optim import Muon, Optimizer
from torch.optim._muon import _adjust_lr

from ref_torch._elementwise import closure_loss


def newton_schulz(grad: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """torch.optim._muon._zeropower_via_newtonschulz with the working dtype as a parameter (a 2-D
    gradient)."""
    # torch's code with `dtype` (a torch.dtype) for its hard-coded bfloat16: in torch.bfloat16 it is
    # torch's iteration exactly
    a, b, c = coefficients
    x = grad.to(dtype)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    return x.T if tall else x


class FloatMuon(Muon):
    """torch.optim.Muon with Newton–Schulz run in `ns_dtype` (torch.float32 or torch.float64)."""

    def __init__(self, params: Any, *, ns_dtype: torch.dtype = torch.float32, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            group.setdefault("ns_dtype", ns_dtype)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Perform a single optimization step (closure: re-evaluates the model, returns the loss)."""
        loss = closure_loss(closure)
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            self._init_group(group, params, grads, bufs)
            lr, mu = group["lr"], group["momentum"]
            for p, g, buf in zip(params, grads, bufs):
                buf.lerp_(g, 1 - mu)
                update = g.lerp(buf, mu) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"],
                                       group["ns_dtype"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss


class MuonWithFallback(Optimizer):
    """One optimizer over Muon groups (`group["use_muon"]` True) and fallback groups (False)."""

    def __init__(self, groups: list[dict[str, Any]], muon: Any, fallback: Any) -> None:
        """`muon(groups)` and `fallback(groups)` build the inner optimizers on the same dicts."""
        super().__init__(groups, {})
        self._muon = muon([g for g in self.param_groups if g["use_muon"]])
        self._fallback = fallback([g for g in self.param_groups if not g["use_muon"]])
        # Muon's defaults: OneCycleLR(cycle_momentum) then drives `momentum`, which Muon groups read
        self.defaults = dict(self._muon.defaults)
        self._share()

    def _share(self) -> None:
        # the inner optimizers read and write the very same group dicts and state
        for inner, flag in ((self._muon, True), (self._fallback, False)):
            inner.param_groups = [g for g in self.param_groups if g["use_muon"] is flag]
            inner.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load_state_dict, then re-share the new group dicts and state with the inner ones."""
        super().load_state_dict(state_dict)
        self._share()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Perform a single optimization step (closure: re-evaluates the model, returns the loss)."""
        loss = closure_loss(closure)
        self._muon.step()
        self._fallback.step()
        return loss
