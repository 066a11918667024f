"""Per-parameter optimizer math written out where the framework's optimizer library has none or
computes it differently, in the operation order of torch.optim's kernels and in its vocabulary (the
equations: conformance/oracle/optimizers.py). Each parameter keeps its own update count, and one
without a gradient in an update keeps its state, as torch.optim does.
"""

# torch: where torch.optim has none, twinstep's own torch.optim.Optimizer classes Lion, AdamVariants (optax's eps_root and
# AMSGrad variants, Keras's eps_hat), RMSpropEpsInSqrt and AdagradEpsInSqrt (optax's eps inside the
# square root), AdamaxEpsHat and NAdamEpsHat (Keras's eps placement), and the built-ins SGD,
# RMSprop, Adagrad and Adamax with decoupled weight decay (`Decoupled*`: torch.optim.AdamW's
# p ← p·(1 − lr·wd) before the built-in's own step). Every other optimizer is torch.optim's own class
# (ref_torch._assembly builds them all).
#
# Each is a thin Optimizer object over a functional core (`_update(group, params, grads, states)`)
# written with torch._foreach_* kernels (one launch per op for a whole group on CUDA; per-tensor
# loops on the CPU), in torch.optim's vocabulary: param_groups carry the hyper-parameters, `state[p]`
# the tensors (torch's names: exp_avg, exp_avg_sq, max_exp_avg_sq, square_avg, grad_avg,
# momentum_buffer, sum) and a float `step` tensor like the built-ins. Parameters whose `grad` is None
# are skipped (state untouched).

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import Optimizer, _get_scalar_dtype

Tensors = list[torch.Tensor]


def closure_loss(closure: Any) -> Any:
    """torch.optim's closure protocol: re-evaluate the model with gradients on; None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Foreach(Optimizer):
    """Collects the parameters with a gradient, creates their state lazily and calls `_update`."""

    STATE: tuple[str, ...] = ()

    def _init_state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        return {name: torch.zeros_like(p, memory_format=torch.preserve_format) for name in self.STATE}

    def _update(self, group: dict[str, Any], params: Tensors, grads: Tensors, states: list[dict]) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Perform a single optimization step (closure: re-evaluates the model, returns the loss)."""
        loss = closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if group.get("maximize", False):
                grads = torch._foreach_neg(grads)
            states = []
            for p in params:
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                    state.update(self._init_state(p, group))
                state["step"] += 1
                states.append(state)
            self._update(group, params, grads, states)
        return loss


def _decay(group: dict[str, Any], params: Tensors, grads: Tensors, decoupled: bool) -> Tensors:
    wd = group["weight_decay"]
    if wd == 0:
        return grads
    if decoupled:
        torch._foreach_mul_(params, 1 - group["lr"] * wd)
        return grads
    return torch._foreach_add(grads, params, alpha=wd)


class DecoupledDecay:
    """Mixin over a torch.optim class: groups with decoupled_weight_decay get p ← p·(1 − lr·wd) for
    the parameters with a gradient, then the class's own step runs with weight_decay = 0 (the order
    of torch.optim.Adam(decoupled_weight_decay=True))."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Perform a single optimization step (closure: re-evaluates the model, returns the loss)."""
        loss = closure_loss(closure)
        held = []
        for group in self.param_groups:  # type: ignore[attr-defined]
            if group.get("decoupled_weight_decay") and group["weight_decay"] != 0:
                params = [p for p in group["params"] if p.grad is not None]
                if params:
                    torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
                held.append((group, group["weight_decay"]))
                group["weight_decay"] = 0.0
        # the torch.optim class's own step without torch's hook wrapper (this step already runs the hooks)
        own = next(c for c in type(self).__mro__ if c.__module__.startswith("torch.optim")).step
        try:
            (own.__wrapped__ if getattr(own, "hooked", False) else own)(self)
        finally:
            for group, wd in held:
                group["weight_decay"] = wd
        return loss


class DecoupledSGD(DecoupledDecay, torch.optim.SGD):
    """torch.optim.SGD with decoupled weight decay."""


class DecoupledRMSprop(DecoupledDecay, torch.optim.RMSprop):
    """torch.optim.RMSprop with decoupled weight decay."""


class DecoupledAdagrad(DecoupledDecay, torch.optim.Adagrad):
    """torch.optim.Adagrad with decoupled weight decay (the group's lr, not lr_decay's rate)."""


class DecoupledAdamax(DecoupledDecay, torch.optim.Adamax):
    """torch.optim.Adamax with decoupled weight decay."""


class Lion(Foreach):
    """Lion (Chen et al. 2023) as lucidrains/lion-pytorch and optax.lion compute it:
    p ← p·(1 − lr·wd); p ← p − lr·sign(β1·m + (1−β1)·g); m ← β2·m + (1−β2)·g; with `cautious`,
    pytorch-optimizer's Lion(cautious=True): the update masked where it disagrees with g."""

    STATE = ("exp_avg",)

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, maximize: bool = False, cautious: bool = False) -> None:
        if not lr >= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Invalid betas: {betas}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay,
                                  "maximize": maximize, "cautious": cautious})

    def _update(self, group, params, grads, states):
        b1, b2 = group["betas"]
        _decay(group, params, grads, decoupled=True)
        m = [s["exp_avg"] for s in states]
        direction = torch._foreach_mul(m, b1)
        torch._foreach_add_(direction, grads, alpha=1 - b1)
        torch._foreach_sign_(direction)
        if group.get("cautious"):  # C-Optim, pytorch-optimizer's apply_cautious: per tensor
            for u, g in zip(direction, grads):
                mask = (u * g > 0).to(g.dtype)
                u.mul_(mask.mul_(mask.numel() / (mask.sum() + 1)))
        torch._foreach_add_(params, direction, alpha=-group["lr"])
        torch._foreach_mul_(m, b2)
        torch._foreach_add_(m, grads, alpha=1 - b2)


class AdamVariants(Foreach):
    """Adam/AdamW with optax's options: eps_root inside the square root, and AMSGrad variants
    ("torch": max of raw v, bias-corrected; "optax": max of the bias-corrected v; "optax_raw":
    max of raw v, no correction), and Keras's eps_hat (eps on the raw sqrt(v), the bias
    correction in the step size). With eps_root = 0, "torch" and no eps_hat it is torch.optim.Adam."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False, decoupled_weight_decay: bool = False, eps_root: float = 0.0,
                 amsgrad_variant: str = "torch", eps_hat: bool = False) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "amsgrad": amsgrad, "maximize": maximize, "eps_root": eps_root,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  "amsgrad_variant": amsgrad_variant, "eps_hat": eps_hat})

    def _init_state(self, p, group):
        names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
        return {n: torch.zeros_like(p, memory_format=torch.preserve_format) for n in names}

    def _update(self, group, params, grads, states):
        b1, b2 = group["betas"]
        grads = _decay(group, params, grads, group["decoupled_weight_decay"])
        m = [s["exp_avg"] for s in states]
        v = [s["exp_avg_sq"] for s in states]
        torch._foreach_lerp_(m, grads, 1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, 1 - b2)
        variant = group["amsgrad_variant"] if group["amsgrad"] else None
        for p, s, mi, vi in zip(params, states, m, v):
            t = s["step"].item()
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            if variant == "optax":
                torch.maximum(s["max_exp_avg_sq"], vi / bc2, out=s["max_exp_avg_sq"])
                second = s["max_exp_avg_sq"]
            elif variant is not None:
                torch.maximum(s["max_exp_avg_sq"], vi, out=s["max_exp_avg_sq"])
                second = s["max_exp_avg_sq"] if variant == "optax_raw" else s["max_exp_avg_sq"] / bc2
            else:
                second = vi / bc2
            if group.get("eps_hat"):  # Keras: α = lr·√(1−β2ᵗ)/(1−β1ᵗ), p ← p − α·m/(√v + ε)
                raw = s["max_exp_avg_sq"] if variant is not None else vi
                p.addcdiv_(mi, raw.sqrt().add_(group["eps"]), value=-group["lr"] * bc2 ** 0.5 / bc1)
                continue
            if variant is None and group["eps_root"] == 0:
                denom = (vi.sqrt() / bc2 ** 0.5).add_(group["eps"])
            else:
                denom = (second + group["eps_root"]).sqrt_().add_(group["eps"])
            p.addcdiv_(mi, denom, value=-group["lr"] / bc1)


class RMSpropEpsInSqrt(Foreach):
    """RMSprop with optax's eps inside the square root: g / sqrt(v + eps) (centered: v − ḡ²);
    otherwise torch.optim.RMSprop (momentum buffer b ← μb + g/s, p ← p − lr·b)."""

    def __init__(self, params: Any, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, *,
                 maximize: bool = False, eps_in_sqrt: bool = True, decoupled_weight_decay: bool = False) -> None:
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay,
                                  "momentum": momentum, "centered": centered, "maximize": maximize,
                                  "eps_in_sqrt": eps_in_sqrt, "decoupled_weight_decay": decoupled_weight_decay})

    def _init_state(self, p, group):
        names = ("square_avg",) + (("momentum_buffer",) if group["momentum"] > 0 else ()) + (
            ("grad_avg",) if group["centered"] else ())
        return {n: torch.zeros_like(p, memory_format=torch.preserve_format) for n in names}

    def _update(self, group, params, grads, states):
        a = group["alpha"]
        grads = _decay(group, params, grads, group.get("decoupled_weight_decay", False))
        sq = [s["square_avg"] for s in states]
        torch._foreach_mul_(sq, a)
        torch._foreach_addcmul_(sq, grads, grads, 1 - a)
        if group["centered"]:
            ga = [s["grad_avg"] for s in states]
            torch._foreach_lerp_(ga, grads, 1 - a)
            var = torch._foreach_addcmul(sq, ga, ga, -1)
        else:
            var = [x.clone() for x in sq]
        if group["eps_in_sqrt"]:
            torch._foreach_add_(var, group["eps"])
            avg = torch._foreach_sqrt(var)
        else:
            avg = torch._foreach_sqrt(var)
            torch._foreach_add_(avg, group["eps"])
        if group["momentum"] > 0:
            buf = [s["momentum_buffer"] for s in states]
            torch._foreach_mul_(buf, group["momentum"])
            torch._foreach_addcdiv_(buf, grads, avg)
            torch._foreach_add_(params, buf, alpha=-group["lr"])
        else:
            torch._foreach_addcdiv_(params, grads, avg, value=-group["lr"])


class AdagradEpsInSqrt(Foreach):
    """Adagrad with optax's eps inside the square root (optax.scale_by_rss): g·rsqrt(S + eps), 0
    where S = 0; lr_decay and initial_accumulator_value as torch.optim.Adagrad."""

    def __init__(self, params: Any, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False,
                 eps_in_sqrt: bool = True, decoupled_weight_decay: bool = False) -> None:
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value, "eps": eps,
                                  "maximize": maximize, "eps_in_sqrt": eps_in_sqrt,
                                  "decoupled_weight_decay": decoupled_weight_decay})

    def _init_state(self, p, group):
        return {"sum": torch.full_like(p, group["initial_accumulator_value"], memory_format=torch.preserve_format)}

    def _update(self, group, params, grads, states):
        grads = _decay(group, params, grads, group.get("decoupled_weight_decay", False))
        acc = [s["sum"] for s in states]
        torch._foreach_addcmul_(acc, grads, grads, 1)
        for p, g, s in zip(params, grads, states):
            clr = group["lr"] / (1 + (s["step"].item() - 1) * group["lr_decay"])
            if group["eps_in_sqrt"]:
                scale = torch.where(s["sum"] > 0, (s["sum"] + group["eps"]).rsqrt(), 0.0)
                p.add_(g * scale, alpha=-clr)
            else:
                p.addcdiv_(g, s["sum"].sqrt().add_(group["eps"]), value=-clr)


class AdamaxEpsHat(Foreach):
    """Adamax with Keras's eps placement: u ← max(β2·u, |g|), p ← p − lr/(1−β1ᵗ)·m/(u + ε)
    (torch.optim.Adamax adds ε inside the max)."""

    STATE = ("exp_avg", "exp_inf")

    def __init__(self, params: Any, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, maximize: bool = False,
                 decoupled_weight_decay: bool = False, eps_hat: bool = True) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "maximize": maximize, "decoupled_weight_decay": decoupled_weight_decay,
                                  "eps_hat": eps_hat})

    def _update(self, group, params, grads, states):
        b1, b2 = group["betas"]
        grads = _decay(group, params, grads, group["decoupled_weight_decay"])
        for p, g, s in zip(params, grads, states):
            s["exp_avg"].lerp_(g, 1 - b1)
            torch.maximum(s["exp_inf"].mul_(b2), g.abs(), out=s["exp_inf"])
            clr = group["lr"] / (1 - b1 ** s["step"].item())
            p.addcdiv_(s["exp_avg"], s["exp_inf"] + group["eps"], value=-clr)


class NAdamEpsHat(Foreach):
    """torch.optim.NAdam (Dozat's momentum schedule, mu_product per parameter) with Keras's eps
    placement: ε on the raw √v, √(1−β2ᵗ) in the step sizes."""

    def __init__(self, params: Any, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3, *,
                 maximize: bool = False, decoupled_weight_decay: bool = False, eps_hat: bool = True) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "momentum_decay": momentum_decay, "maximize": maximize,
                                  "decoupled_weight_decay": decoupled_weight_decay, "eps_hat": eps_hat})

    def _init_state(self, p, group):
        # torch keeps mu_product as a 0-d tensor: float64 for float64 parameters (twinstep's rule)
        scalar = torch.float64 if p.dtype == torch.float64 else torch.float32
        return {"mu_product": torch.ones((), dtype=scalar),
                **{n: torch.zeros_like(p, memory_format=torch.preserve_format) for n in ("exp_avg", "exp_avg_sq")}}

    def _update(self, group, params, grads, states):
        b1, b2 = group["betas"]
        psi, lr = group["momentum_decay"], group["lr"]
        grads = _decay(group, params, grads, group["decoupled_weight_decay"])
        for p, g, s in zip(params, grads, states):
            t = s["step"].item()
            bc2 = 1 - b2 ** t
            mu = b1 * (1.0 - 0.5 * 0.96 ** (t * psi))
            mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * psi))
            s["mu_product"] *= mu
            prod = s["mu_product"].item()
            s["exp_avg"].lerp_(g, 1 - b1)
            s["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = s["exp_avg_sq"].sqrt().add_(group["eps"])
            p.addcdiv_(g, denom, value=-lr * (1.0 - mu) / (1.0 - prod) * bc2 ** 0.5)
            p.addcdiv_(s["exp_avg"], denom, value=-lr * mu_next / (1.0 - prod * mu_next) * bc2 ** 0.5)
