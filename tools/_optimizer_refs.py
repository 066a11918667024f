"""The references of tools/gen_optimizer_cases.py: a spec run on torch.optim's and optax's own optimizers.

`run_torch` steps torch.optim built-ins in float64 (torch.set_default_dtype(float64), so that NAdam's
mu_product is float64 too); `run_optax` steps optax's own optimizers under jax x64, for what torch has
no built-in for (Lion, eps_root, optax's AMSGrad, Adagrad and RMSprop with eps inside the square root,
optax.nadam); `run_pytorch_optimizer` steps pytorch-optimizer's Lion (cautious updates);
`run_heavyball` steps heavyball's AdamW (cautious weight decay); `run_prodigyopt` steps prodigyopt's Prodigy;
`run_schedulefree` steps the schedulefree package's AdamWScheduleFree / SGDScheduleFree
in train mode (the parameters are its y). All return the parameters and the state under the neutral
names of docs/contract.md §4 after every update.

Two options torch's classes lack are applied around torch's own step, by definition:
`decoupled_weight_decay` on SGD, RMSprop, Adagrad and Adamax is p ← p·(1 − lr·wd) on the parameters
with a gradient before `step()` with weight_decay = 0 (torch.optim.Adam(decoupled_weight_decay=True)'s
order); `eps_hat` on Adam, AdamW and NAdam is torch's step with eps_t = eps/√(1 − β2ᵗ) set before
update t (ε/√(1−β2ᵗ) added to √v̂ is ε added to the raw √v, Kingma & Ba §2's ε̂), which needs every
parameter to have a gradient at every update. The spec -> torch.optim translation (`torch_optimizers`, `_groups`) is this
module's own, written from torch's constructor signatures: nothing here imports ref_torch, ref_jax or
the oracle.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np
import torch

NEUTRAL = {  # torch state key -> neutral name
    "exp_avg": "m", "exp_avg_sq": "v", "max_exp_avg_sq": "v_max", "exp_inf": "u", "sum": "sum",
    "square_avg": "square_avg", "grad_avg": "grad_avg", "momentum_buffer": "momentum_buffer",
    "mu_product": "mu_product", "row_var": "row_var", "col_var": "col_var", "variance": "variance",
}
TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
         "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad, "adamax": torch.optim.Adamax,
         "nadam": torch.optim.NAdam, "radam": torch.optim.RAdam, "adafactor": torch.optim.Adafactor,
         "muon": torch.optim.Muon}


def _kwargs(table: dict[str, Any]) -> dict[str, Any]:
    out = {k: (tuple(v) if isinstance(v, list) else v) for k, v in table.items()
           if k not in ("name", "groups", "fallback", "fallback_params", "no_weight_decay", "params")}
    if isinstance(out.get("eps"), tuple):  # adafactor: "auto" is torch's None
        out["eps"] = tuple(None if e == "auto" else e for e in out["eps"])
    return out


def _groups(spec: dict[str, Any], names: list[str]) -> list[tuple[dict[str, Any], list[str]]]:
    """[(overrides, names)] per [[groups]] entry, then the default group (this script's own matcher)."""
    taken: set[str] = set()
    out = []
    for g in spec.get("groups", []):
        hit = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in g["params"])]
        taken |= set(hit)
        out.append((_kwargs(g), hit))
    out.append(({}, [n for n in names if n not in taken]))
    no_decay = spec.get("no_weight_decay")
    if not no_decay:
        return out
    split = []
    for overrides, ns in out:
        off = [n for n in ns if any(fnmatch.fnmatchcase(n, p) for p in no_decay)]
        split += [(overrides, [n for n in ns if n not in off]), ({**overrides, "weight_decay": 0.0}, off)]
    return split


NO_DECOUPLED = ("sgd", "rmsprop", "adagrad", "adamax")  # torch classes without decoupled_weight_decay


def torch_optimizers(spec: dict[str, Any], named: dict[str, torch.nn.Parameter],
                     classes: dict[str, Any] = TORCH) -> list[torch.optim.Optimizer]:
    names = list(named)
    if spec["name"] != "muon":
        groups = [{"params": [named[n] for n in ns], **o} for o, ns in _groups(spec, names)]
        kwargs = _kwargs(spec)
        kwargs.pop("eps_hat", None)  # applied by run_torch through eps
        for g in groups:
            g.pop("eps_hat", None)
        if spec["name"] in NO_DECOUPLED and kwargs.pop("decoupled_weight_decay", False):
            for g in groups:  # run_torch decays before the step; torch's own decay is off
                g["decoupled"] = g.pop("weight_decay", kwargs.get("weight_decay", 0.0))
                g["weight_decay"] = 0.0
        return [classes[spec["name"]](groups, **kwargs)]
    fb = spec.get("fallback", {"name": "adamw"})
    forced = set(spec.get("fallback_params", []))
    muon_names = [n for n in names if named[n].ndim == 2 and n not in forced]
    rest = [n for n in names if n not in muon_names]
    muon = torch.optim.Muon([{"params": [named[n] for n in muon_names]}], **_kwargs(spec))
    other = TORCH[fb["name"]]([{"params": [named[n] for n in rest]}], **_kwargs(fb))
    return [muon, other]


def _set_grads(named: dict[str, torch.nn.Parameter], grads: dict | None, objective: dict | None) -> None:
    """One update's gradients: the given ones (None where missing), else the quadratic objective's."""
    for name, p in named.items():
        if grads is not None:
            g = grads.get(name)
            p.grad = None if g is None else torch.tensor(np.asarray(g, np.float64))
        else:
            c, w = (torch.tensor(np.asarray(objective[x][name], np.float64)) for x in ("center", "curvature"))
            p.grad = (w * (p.detach() - c)).clone()


def run_torch(spec: dict[str, Any], params: dict[str, Any], grads: list[dict] | None, objective: dict | None,
              steps: int | None, classes: dict[str, Any] = TORCH) -> tuple[list[dict], list[dict]]:
    torch.set_default_dtype(torch.float64)
    named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64))) for k, v in params.items()}
    opts = torch_optimizers(spec, named, classes)
    counts = {k: 0 for k in named}
    out_p, out_s = [], []
    for k in range(len(grads) if grads is not None else steps):
        _set_grads(named, grads[k] if grads is not None else None, objective)
        for name, p in named.items():
            counts[name] += p.grad is not None
        for o in opts:
            _decay_and_eps(spec, o, k + 1)
            o.step()
        out_p.append({n: p.detach().numpy().copy() for n, p in named.items()})
        state = {}
        for name, p in named.items():
            st = next((o.state[p] for o in opts if p in o.state and o.state[p]), {})
            if counts[name] == 0:
                continue
            entry = {NEUTRAL[key]: v.detach().numpy().copy() for key, v in st.items() if key in NEUTRAL and v is not None}
            entry["step"] = np.asarray(counts[name])
            state[name] = entry
        out_s.append(state)
    return out_p, out_s


def _decay_and_eps(spec: dict[str, Any], opt: torch.optim.Optimizer, t: int) -> None:
    """The two options torch's classes lack, applied around their step (see the module docstring)."""
    with torch.no_grad():
        for g in opt.param_groups:
            if g.get("decoupled"):
                for p in g["params"]:
                    if p.grad is not None:
                        p.mul_(1 - g["lr"] * g["decoupled"])
            if spec.get("eps_hat") and spec["name"] in ("adam", "adamw", "nadam"):
                g.setdefault("eps_hat_base", g["eps"])
                g["eps"] = g["eps_hat_base"] / (1 - g["betas"][1] ** t) ** 0.5


def run_pytorch_optimizer(spec: dict[str, Any], params: dict[str, Any], grads: list[dict] | None,
                          objective: dict | None, steps: int | None) -> tuple[list[dict], list[dict]]:
    """pytorch-optimizer 4.1.0's Lion (cautious=True: its apply_cautious) in float64, stepped as
    run_torch steps torch.optim's classes."""
    from pytorch_optimizer import Lion

    return run_torch(spec, params, grads, objective, steps, classes={"lion": Lion})


def run_heavyball(spec: dict[str, Any], params: dict[str, Any], grads: list[dict] | None,
                  objective: dict | None, steps: int | None) -> tuple[list[dict], list[dict]]:
    """heavyball 3.2.1's AdamW (cautious_weight_decay: decay × [signbit(p) = signbit(u)]) in float64
    (storage_dtype="float64", compile_step=False), stepped as run_torch steps torch.optim's classes;
    parameters only (its state keys are its own). Its eps is max(√v̂, ε) where torch's is √v̂ + ε:
    the same at eps = 0, which the cases use."""
    import heavyball

    def adamw(groups: Any, **kwargs: Any) -> torch.optim.Optimizer:
        return heavyball.AdamW(groups, storage_dtype="float64", compile_step=False, **kwargs)

    return run_torch(spec, params, grads, objective, steps, classes={"adamw": adamw})[0], []


def run_prodigyopt(spec: dict[str, Any], params: dict[str, Any], grads: list[dict] | None,
                   objective: dict | None, steps: int | None) -> tuple[list[dict], list[dict]]:
    """prodigyopt 1.1.2's Prodigy in float64 (its d and sums are Python floats; the tensors float64),
    stepped as run_torch steps torch.optim's classes (the spec's names are its own); state: exp_avg, exp_avg_sq, s, p0 and step per parameter, and its first
    group's d, d_max, d_numerator and k in every entry."""
    from prodigyopt import Prodigy

    torch.set_default_dtype(torch.float64)
    named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64))) for k, v in params.items()}
    kwargs = _kwargs(spec)
    opt = Prodigy([{"params": [named[n] for n in ns], **o} for o, ns in _groups(spec, list(named))], **kwargs)
    out_p, out_s = [], []
    for k in range(len(grads) if grads is not None else steps):
        _set_grads(named, grads[k] if grads is not None else None, objective)
        opt.step()
        out_p.append({n: p.detach().numpy().copy() for n, p in named.items()})
        first = opt.param_groups[0]
        shared = {key: np.asarray(float(first[key])) for key in ("d", "d_max", "d_numerator", "k")}
        state = {}
        for name, p in named.items():
            st = opt.state.get(p, {})
            if st.get("step", 0) == 0:
                continue
            p0 = st["p0"].detach().numpy()  # flat (slice_p = 1), or 0-d for a parameter that was all zeros
            state[name] = {"step": np.asarray(st["step"]), "v": st["exp_avg_sq"].detach().numpy().copy(),
                           "s": st["s"].detach().numpy().reshape(p.shape).copy(),
                           "p0": (p0.reshape(p.shape) if p0.ndim else np.broadcast_to(p0, p.shape)).copy(), **shared}
            if "exp_avg" in st:  # none at beta1 = 0
                state[name]["m"] = st["exp_avg"].detach().numpy().copy()
        out_s.append(state)
    return out_p, out_s


def run_schedulefree(spec: dict[str, Any], params: dict[str, Any], grads: list[dict] | None,
                     objective: dict | None, steps: int | None) -> tuple[list[dict], list[dict]]:
    """schedulefree.AdamWScheduleFree / SGDScheduleFree (foreach=False) in float64, train mode: the
    parameters after each update are its y; state z, v (exp_avg_sq) and the group's k, weight_sum,
    lr_max per parameter (every parameter must have a gradient at every update)."""
    import schedulefree

    torch.set_default_dtype(torch.float64)
    cls = {"schedule_free_adamw": schedulefree.AdamWScheduleFree,
           "schedule_free_sgd": schedulefree.SGDScheduleFree}[spec["name"]]
    named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64))) for k, v in params.items()}
    groups = [{"params": [named[n] for n in ns], **o} for o, ns in _groups(spec, list(named))]
    opt = cls(groups, **_kwargs(spec), foreach=False)
    opt.train()
    out_p, out_s = [], []
    for k in range(len(grads) if grads is not None else steps):
        for name, p in named.items():
            if grads is not None:
                p.grad = torch.tensor(np.asarray(grads[k][name], np.float64))
            else:
                c, w = (torch.tensor(np.asarray(objective[x][name], np.float64)) for x in ("center", "curvature"))
                p.grad = (w * (p.detach() - c)).clone()
        opt.step()
        out_p.append({n: p.detach().numpy().copy() for n, p in named.items()})
        state = {}
        for g in opt.param_groups:
            for p in g["params"]:
                name = next(n for n, q in named.items() if q is p)
                st = opt.state[p]
                entry = {"step": np.asarray(g["k"]), "z": st["z"].numpy().copy(),
                         "weight_sum": np.asarray(g["weight_sum"]), "lr_max": np.asarray(g["lr_max"])}
                if "exp_avg_sq" in st:
                    entry["v"] = st["exp_avg_sq"].numpy().copy()
                state[name] = entry
        out_s.append(state)
    return out_p, out_s


def ademamix_schedules(spec: dict[str, Any]) -> tuple[Any, Any]:
    """apple/ml-ademamix's warm-ups (pytorch/ademamix.py: linear_hl_warmup_scheduler for β3 from β1,
    linear_warmup_scheduler for α from 0, both at the parameter's step t after its increment, and
    f(β) = ln 0.5 / ln(β + 1e-8) − 1) as callables of optax's count, which optax.contrib.ademamix
    evaluates before its increment: t = count + 1."""
    import jax.numpy as jnp

    b1, b3, alpha = spec.get("betas", (0.9, 0.999))[0], spec.get("beta3", 0.9999), spec.get("alpha", 2.0)
    tb, ta = spec.get("beta3_warmup", 0), spec.get("alpha_warmup", 0)

    def f(beta: float) -> Any:
        return jnp.log(0.5) / jnp.log(beta + 1e-8) - 1

    def b3_at(count: Any) -> Any:
        step = jnp.asarray(count, jnp.float64) + 1
        a = step / max(tb, 1)
        return jnp.where(step < tb, jnp.power(0.5, 1 / ((1.0 - a) * f(b1) + a * f(b3) + 1)), b3)

    def alpha_at(count: Any) -> Any:
        step = jnp.asarray(count, jnp.float64) + 1
        a = step / max(ta, 1)
        return jnp.where(step < ta, (1.0 - a) * 0.0 + a * alpha, alpha)

    return b3_at, alpha_at


def optax_transform(spec: dict[str, Any]) -> Any:
    """optax's own optimizer for the optax-semantics specs (one group, constant hyper-parameters)."""
    import jax.numpy as jnp
    import optax

    name, lr, wd = spec["name"], spec.get("lr"), spec.get("weight_decay", 0.0)
    b1, b2 = spec.get("betas", (0.9, 0.999 if name != "lion" else 0.99))
    if name == "lion":
        return optax.lion(lr, b1, b2, weight_decay=wd)
    if name == "ademamix":
        b3_at, alpha_at = ademamix_schedules(spec)
        return optax.contrib.ademamix(lr, b1, b2, b3_at, alpha_at, eps=spec.get("eps", 1e-8), weight_decay=wd)
    if name == "rmsprop":
        tx = optax.rmsprop(lr, decay=spec.get("alpha", 0.99), eps=spec.get("eps", 1e-8), eps_in_sqrt=True,
                           centered=spec.get("centered", False), momentum=spec.get("momentum") or None)
    elif name == "adagrad":
        decay = spec.get("lr_decay", 0.0)
        tx = optax.adagrad(lambda c: lr / (1 + jnp.asarray(c, jnp.float64) * decay),
                           initial_accumulator_value=spec.get("initial_accumulator_value", 0.0),
                           eps=spec.get("eps", 1e-10))
    elif name in ("adam", "adamw") and spec.get("amsgrad"):
        inner = optax.amsgrad(lr, b1, b2, eps=spec.get("eps", 1e-8), eps_root=spec.get("eps_root", 0.0),
                              bias_correction_nu=spec["amsgrad_variant"] == "optax")
        if name == "adamw":
            return optax.chain(optax.scale_by_amsgrad(b1, b2, spec.get("eps", 1e-8), spec.get("eps_root", 0.0),
                                                      bias_correction_nu=spec["amsgrad_variant"] == "optax"),
                               optax.add_decayed_weights(spec.get("weight_decay", 1e-2)),
                               optax.scale_by_learning_rate(lr))
        tx = inner
    elif name in ("adam", "adamw"):
        if name == "adamw":
            return optax.adamw(lr, b1, b2, eps=spec.get("eps", 1e-8), eps_root=spec.get("eps_root", 0.0),
                               weight_decay=spec.get("weight_decay", 1e-2))
        tx = optax.adam(lr, b1, b2, eps=spec.get("eps", 1e-8), eps_root=spec.get("eps_root", 0.0))
    elif name == "nadam":
        if spec.get("decoupled_weight_decay"):
            return optax.nadamw(lr, b1, b2, eps=spec.get("eps", 1e-8), weight_decay=wd)
        tx = optax.nadam(lr, b1, b2, eps=spec.get("eps", 1e-8))
    else:
        raise ValueError(f"no optax reference for {name}")
    return optax.chain(optax.add_decayed_weights(wd), tx) if wd else tx


def run_optax(spec: dict[str, Any], params: dict[str, Any], grads: list[dict] | None, objective: dict | None,
              steps: int | None) -> tuple[list[dict], list[dict]]:
    import jax
    import jax.numpy as jnp
    import optax

    names = {"mu": "m", "nu": "v", "nu_max": "v_hat_max" if spec.get("amsgrad_variant") == "optax" else "v_max",
             "sum_of_squares": "sum"}
    if spec["name"] == "rmsprop":
        names = {"nu": "square_avg", "mu": "grad_avg"}
    if spec["name"] == "ademamix":
        names = {"m1": "m", "m2": "m_slow", "nu": "v"}
    with jax.enable_x64(True):
        tx = optax_transform(spec)
        p = {k: jnp.asarray(np.asarray(v, np.float64)) for k, v in params.items()}
        st = tx.init(p)
        out_p, out_s = [], []
        for k in range(len(grads) if grads is not None else steps):
            if grads is not None:
                g = {n: jnp.asarray(np.asarray(grads[k][n], np.float64)) for n in p}
            else:
                g = {n: jnp.asarray(objective["curvature"][n]) * (p[n] - jnp.asarray(objective["center"][n])) for n in p}
            u, st = tx.update(g, st, p)
            p = optax.apply_updates(p, u)
            out_p.append({n: np.asarray(v) for n, v in p.items()})
            entry: dict[str, dict] = {n: {"step": np.asarray(k + 1)} for n in p}
            for field, neutral in names.items():
                for tree in optax.tree_utils.tree_get_all_with_path(st, field):
                    for n, v in tree[1].items():
                        entry[n][neutral] = np.asarray(v)
            out_s.append(entry)
    return out_p, out_s
