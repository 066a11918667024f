"""Template source of the small torch optimizers a `twinstep port --to torch` snippet carries where
torch.optim has no class for the spec's semantics: Lion, optax's eps placements and AMSGrad
variants, Keras's eps_hat for Adam, Muon in float or with a fallback, NAdam's float64 mu_product
and decoupled weight decay for the classes without it.

Package data, never imported by twinstep: conformance.port.write.torch_parts copies each class or
function below into a snippet verbatim (split with ast), so it must run with nothing but torch
and the NS_DTYPE the snippet defines. Each optimizer is a plain torch.optim.Optimizer with torch's
state names and per-parameter `step`, written from the equations in conformance/oracle/optimizers.py.
tests/test_port_templates.py compiles this file and runs one step of every class.
"""

import torch

NS_DTYPE = torch.float32  # the snippet defines its own: the spec's muon ns_dtype


class PerParameter(torch.optim.Optimizer):
    """torch.optim-style base: state created at a parameter's first update, a float `step` per
    parameter, parameters without a gradient skipped, maximize negating the gradient first."""

    def __init__(self, params, **defaults):
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state.update(self.init_state(p, group))
                state["step"] += 1
                self.update(p, -p.grad if group.get("maximize") else p.grad, state, group)


class Lion(PerParameter):
    """Lion (optax.lion, lucidrains/lion-pytorch): p <- p*(1 - lr*wd) - lr*sign(b1*m + (1 - b1)*g);
    m <- b2*m + (1 - b2)*g."""

    def init_state(self, p, group):
        return {"exp_avg": torch.zeros_like(p)}

    def update(self, p, g, state, group):
        b1, b2 = group["betas"]
        m = state["exp_avg"]
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(torch.sign(m * b1 + g * (1 - b1)), alpha=-group["lr"])
        m.mul_(b2).add_(g, alpha=1 - b2)


class AdamOptax(PerParameter):
    """Adam/AdamW with optax's options: sqrt(v_hat + eps_root) + eps, and the AMSGrad variants
    "torch" (max of the raw v, bias-corrected), "optax" (max of the bias-corrected v_hat),
    "optax_raw" (max of the raw v, no correction); eps_hat (Keras): eps on the raw sqrt(v) and
    sqrt(1 - b2^t) in the step size."""

    def init_state(self, p, group):
        names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
        return {n: torch.zeros_like(p) for n in names}

    def update(self, p, g, state, group):
        b1, b2 = group["betas"]
        lr, wd, t = group["lr"], group["weight_decay"], state["step"].item()
        if wd and group["decoupled_weight_decay"]:
            p.mul_(1 - lr * wd)
        elif wd:
            g = g.add(p, alpha=wd)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        variant = group["amsgrad_variant"] if group["amsgrad"] else None
        if variant == "optax":
            second = torch.maximum(state["max_exp_avg_sq"], v / bc2, out=state["max_exp_avg_sq"])
        elif variant is not None:
            second = torch.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])
            second = second if variant == "optax_raw" else second / bc2
        else:
            second = v / bc2
        if group.get("eps_hat"):
            raw = state["max_exp_avg_sq"] if variant is not None else v
            p.addcdiv_(m, raw.sqrt().add_(group["eps"]), value=-lr * bc2 ** 0.5 / bc1)
            return
        p.addcdiv_(m, (second + group["eps_root"]).sqrt_().add_(group["eps"]), value=-lr / bc1)


class RMSpropEpsInSqrt(PerParameter):
    """RMSprop with optax's eps inside the square root: g / sqrt(v + eps) (centered: v - mean(g)^2);
    otherwise torch.optim.RMSprop (buffer b <- mu*b + g/s, p <- p - lr*b)."""

    def init_state(self, p, group):
        names = ["square_avg"] + (["momentum_buffer"] if group["momentum"] > 0 else []) + (
            ["grad_avg"] if group["centered"] else [])
        return {n: torch.zeros_like(p) for n in names}

    def update(self, p, g, state, group):
        a = group["alpha"]
        if group["weight_decay"]:
            g = g.add(p, alpha=group["weight_decay"])
        sq = state["square_avg"].mul_(a).addcmul_(g, g, value=1 - a)
        if group["centered"]:
            avg = state["grad_avg"].lerp_(g, 1 - a)
            var = sq.addcmul(avg, avg, value=-1)
        else:
            var = sq
        denom = (var + group["eps"]).sqrt() if group["eps_in_sqrt"] else var.sqrt().add_(group["eps"])
        if group["momentum"] > 0:
            buf = state["momentum_buffer"].mul_(group["momentum"]).addcdiv_(g, denom)
            p.add_(buf, alpha=-group["lr"])
        else:
            p.addcdiv_(g, denom, value=-group["lr"])


class AdagradEpsInSqrt(PerParameter):
    """Adagrad with optax's eps inside the square root (optax.scale_by_rss): g / sqrt(S + eps), 0
    where S = 0; lr_decay and initial_accumulator_value as torch.optim.Adagrad."""

    def init_state(self, p, group):
        return {"sum": torch.full_like(p, group["initial_accumulator_value"])}

    def update(self, p, g, state, group):
        if group["weight_decay"]:
            g = g.add(p, alpha=group["weight_decay"])
        acc = state["sum"].addcmul_(g, g, value=1)
        clr = group["lr"] / (1 + (state["step"].item() - 1) * group["lr_decay"])
        if group["eps_in_sqrt"]:
            p.add_(g * torch.where(acc > 0, (acc + group["eps"]).rsqrt(), 0.0), alpha=-clr)
        else:
            p.addcdiv_(g, acc.sqrt().add_(group["eps"]), value=-clr)


class FloatMuon(torch.optim.Muon):
    """torch.optim.Muon with its Newton-Schulz iteration in NS_DTYPE instead of bfloat16."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            a, b, c = group["ns_coefficients"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"].lerp_(p.grad, 1 - group["momentum"])
                x = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                x = x.to(NS_DTYPE)
                tall = x.size(0) > x.size(1)
                x = x.T if tall else x
                x = x.div(x.norm().clamp(min=group["eps"]))
                for _ in range(group["ns_steps"]):
                    gram = x @ x.T
                    x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
                x = x.T if tall else x
                rows, cols = p.shape
                ratio = max(1.0, rows / cols) ** 0.5 if group["adjust_lr_fn"] in (None, "original") \
                    else 0.2 * max(rows, cols) ** 0.5
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(x.to(p.dtype), alpha=-group["lr"] * ratio)


class MuonWithFallback(torch.optim.Optimizer):
    """One optimizer over Muon groups (2-D parameters) and fallback groups: both inner optimizers
    read and write the very same group dicts and state, so one scheduler drives them."""

    def __init__(self, groups, fallback_class, muon_class=torch.optim.Muon):
        super().__init__(groups, {})
        self.muon = muon_class([g for g in self.param_groups if g["use_muon"]])
        self.fallback = fallback_class([g for g in self.param_groups if not g["use_muon"]])
        self.defaults = dict(self.muon.defaults)
        for inner, flag in ((self.muon, True), (self.fallback, False)):
            inner.param_groups = [g for g in self.param_groups if g["use_muon"] is flag]
            inner.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        self.muon.step()
        self.fallback.step()


def float64_mu_product(optimizer, args, kwargs):
    """torch keeps NAdam's mu_product in float32 unless the default dtype is float64; the spec keeps
    it in float64 for float64 parameters (register as a step pre-hook)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None and p.dtype == torch.float64 and not optimizer.state[p]:
                optimizer.state[p].update(step=torch.tensor(0.0), mu_product=torch.ones((), dtype=torch.float64),
                                          exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))


def decoupled_decay(optimizer, args, kwargs):
    """torch.optim.AdamW's decoupled weight decay p <- p*(1 - lr*wd) before the class's own step, for
    a class without decoupled_weight_decay (register as a step pre-hook): each group holds its decay
    as `decoupled_decay` and weight_decay = 0, so the class adds no L2 term."""
    with torch.no_grad():
        for group in optimizer.param_groups:
            wd = group.get("decoupled_decay", 0.0)
            for p in group["params"]:
                if wd and p.grad is not None:
                    p.mul_(1 - group["lr"] * wd)
