"""Write `optimizer` cases with [schedule] and/or [clip] whose expected values come from torch's own
objects: torch.optim + torch.optim.lr_scheduler + torch.nn.utils.clip_grad_norm_ / clip_grad_value_
(AdEMAMix's scheduled β3 and α: optax.contrib.ademamix, which takes them as functions of its count;
Prodigy: prodigyopt 1.1.2's class under torch's scheduler and clipping).

    python tools/gen_update_cases.py                   # the bundled cases (conformance/cases/optimizer/update)
    python tools/gen_update_cases.py --out /tmp/update-cases && twinstep conform --cases /tmp/update-cases

Each case is one native set-up written twice by hand: as the spec tables a user would write, and as
the torch objects that mean the same (constructor arguments side by side below). The native loop is
the one torch users write, in float64 (torch.set_default_dtype(float64)):

    p.grad = g_t;  clip_grad_norm_(params, max_norm, norm_type)  (or clip_grad_value_);
    optimizer.step();  scheduler.step()

so update t applies the scheduler's lr at t (docs/contract.md §2) to the clipped gradients. The
spec -> torch.optim translation of the optimizer is tools/_optimizer_refs.py's (the generator's own);
nothing here imports ref_torch, ref_jax or the oracle.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim import lr_scheduler as S

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the references beside this script
from _optimizer_refs import torch_optimizers  # noqa: E402
from gen_optimizer_cases import _inline, _key, _rng_params  # noqa: E402

from conformance import tomlio  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "optimizer" / "update"
Clip = Callable[[list[torch.nn.Parameter]], Any] | None
Hyper = Callable[[list[torch.optim.Optimizer], int], None] | None
Native = Callable[[dict[str, np.ndarray], list[dict[str, np.ndarray]]], list[dict]]

SCALAR = {"theta": ()}
OPEN = {"w": (2, 3), "b": (3,)}
NAMED = {"enc.weight": (2, 2), "enc.bias": (2,), "head.weight": (2, 2), "head.bias": (2,)}


def native_trajectory(spec: dict[str, Any], make_schedule: Callable[[torch.optim.Optimizer], Any] | None,
                      clip: Clip, params: dict[str, np.ndarray], grads: list[dict[str, np.ndarray]],
                      hyper: Hyper = None, peer: str | None = None) -> list[dict]:
    """The parameters after each update of torch's own objects, in float64. `hyper(optimizers, t)`
    sets param_group values before update t's step, as a training loop does by hand (muon: the
    Muon optimizer, then its fallback). `peer` "prodigyopt": prodigyopt 1.1.2's Prodigy."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        named = {k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64))) for k, v in params.items()}
        if peer == "prodigyopt":
            from prodigyopt import Prodigy

            opts = torch_optimizers(spec, named, {"prodigy": Prodigy})
        else:
            opts = torch_optimizers(spec, named)
        scheduler = make_schedule(opts[0]) if make_schedule is not None else None
        out = []
        for t, g in enumerate(grads):
            for name, p in named.items():
                p.grad = torch.tensor(np.asarray(g[name], np.float64))
            if clip is not None:
                clip(list(named.values()))
            if hyper is not None:
                hyper(opts, t)
            for opt in opts:
                opt.step()
            if scheduler is not None:
                scheduler.step()
            out.append({k: p.detach().numpy().copy() for k, p in named.items()})
        return out
    finally:
        torch.set_default_dtype(previous)


def _arr(x: Any) -> Any:
    return np.asarray(x, np.float64).tolist()


def write_case(path: Path, case_id: str, source: str, tables: dict[str, Any], params: dict[str, np.ndarray],
               grads: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]]) -> None:
    head = tomlio.dumps({"id": case_id, "kind": "optimizer", "source": source, **tables})
    inputs = {"params": {k: _arr(v) for k, v in params.items()},
              "grads": [{k: _arr(v) for k, v in g.items()} for g in grads]}
    lines = [head.rstrip(), "", "[inputs]"]
    lines += [f"{_key(k)} = {_inline(v, 0 if k != 'grads' else 1)}" for k, v in inputs.items()]
    lines += ["", "[expected]", f"params = {_inline([{k: _arr(v) for k, v in p.items()} for p in expected], 1)}"]
    path.write_text("\n".join(lines) + "\n")


def bundled() -> list[dict[str, Any]]:
    """(id, note, spec tables, native scheduler, native clip, shapes, updates, grad scale)."""
    norm = torch.nn.utils.clip_grad_norm_
    value = torch.nn.utils.clip_grad_value_
    return [
        dict(id="torch-adam-steplr", note="Adam(lr=0.1) + StepLR(step_size=2, gamma=0.5): update 2 applies lr 0.05",
             tables={"optimizer": {"name": "adam", "lr": 0.1}, "schedule": {"name": "step", "step_size": 2, "gamma": 0.5}},
             sched=lambda o: S.StepLR(o, step_size=2, gamma=0.5), clip=None, shapes=SCALAR, n=5),
        dict(id="torch-adamw-cosine-clip", note="AdamW + CosineAnnealingLR(T_max=4, eta_min=1e-3) + "
             "clip_grad_norm_(max_norm=0.5), two param groups",
             tables={"optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.1,
                                   "groups": [{"params": ["head.*"], "lr": 0.01}]},
                     "schedule": {"name": "cosine", "t_max": 4, "eta_min": 1e-3}, "clip": {"max_norm": 0.5}},
             sched=lambda o: S.CosineAnnealingLR(o, T_max=4, eta_min=1e-3), clip=lambda ps: norm(ps, 0.5),
             shapes=NAMED, n=6),
        dict(id="torch-sgd-onecycle-clip-value", note="SGD(momentum=0.9, nesterov) + OneCycleLR(max_lr=0.5, "
             "total_steps=8) cycling the momentum + clip_grad_value_(0.3)",
             tables={"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True},
                     "schedule": {"name": "onecycle", "max_lr": 0.5, "total_steps": 8}, "clip": {"clip_value": 0.3}},
             sched=lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=8), clip=lambda ps: value(ps, 0.3),
             shapes=OPEN, n=8),
        dict(id="torch-rmsprop-linear-clip-inf", note="RMSprop + LinearLR(start_factor=0.2, total_iters=3) + "
             "clip_grad_norm_(max_norm=0.4, norm_type=inf)",
             tables={"optimizer": {"name": "rmsprop", "lr": 0.01, "momentum": 0.5},
                     "schedule": {"name": "linear", "start_factor": 0.2, "end_factor": 1.0, "total_iters": 3},
                     "clip": {"max_norm": 0.4, "norm_type": float("inf")}},
             sched=lambda o: S.LinearLR(o, start_factor=0.2, end_factor=1.0, total_iters=3),
             clip=lambda ps: norm(ps, 0.4, norm_type=float("inf")), shapes=OPEN, n=5),
        dict(id="torch-adam-warmup-cosine", note="Adam + SequentialLR([LinearLR(0.1, 1.0, 2), "
             "CosineAnnealingLR(T_max=4)], milestones=[2])",
             tables={"optimizer": {"name": "adam", "lr": 0.02, "betas": [0.8, 0.99]},
                     "schedule": {"name": "sequential", "milestones": [2], "schedulers": [
                         {"name": "linear", "start_factor": 0.1, "end_factor": 1.0, "total_iters": 2},
                         {"name": "cosine", "t_max": 4}]}},
             sched=lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 2), S.CosineAnnealingLR(o, T_max=4)], [2]),
             clip=None, shapes=OPEN, n=6),
        dict(id="torch-sgd-clip-norm", note="SGD(momentum=0.5) + clip_grad_norm_(max_norm=1.0), gradients "
             "large enough that every update is clipped",
             tables={"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.5}, "clip": {"max_norm": 1.0}},
             sched=None, clip=lambda ps: norm(ps, 1.0), shapes=OPEN, n=4, scale=3.0),
        dict(id="torch-nadam-multistep-groups-clip", note="NAdam + MultiStepLR(milestones=[1, 3], gamma=0.3) + "
             "clip_grad_norm_(max_norm=0.8, norm_type=1), no weight decay on biases",
             tables={"optimizer": {"name": "nadam", "lr": 0.02, "weight_decay": 0.1, "no_weight_decay": ["*.bias"]},
                     "schedule": {"name": "multistep", "milestones": [1, 3], "gamma": 0.3},
                     "clip": {"max_norm": 0.8, "norm_type": 1.0}},
             sched=lambda o: S.MultiStepLR(o, milestones=[1, 3], gamma=0.3), clip=lambda ps: norm(ps, 0.8, norm_type=1.0),
             shapes=NAMED, n=5),
        dict(id="torch-sgd-polynomial-past-end", note="SGD(momentum=0.9) + PolynomialLR(total_iters=10, power=0.9) "
             "for 13 updates: lr 0 from update 10 on (a jitted 1 − t/T is −1.5e-8 in float32 there, pow NaN)",
             tables={"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
                     "schedule": {"name": "polynomial", "total_iters": 10, "power": 0.9}},
             sched=lambda o: S.PolynomialLR(o, total_iters=10, power=0.9), clip=None, shapes=OPEN, n=13),
        dict(id="torch-adam-clip-value-then-norm", note="Adam + clip_grad_value_(0.4) then clip_grad_norm_(0.6): "
             "the norm rule sees the clamped gradients",
             tables={"optimizer": {"name": "adam", "lr": 0.05}, "clip": {"clip_value": 0.4, "max_norm": 0.6}},
             sched=None, clip=lambda ps: (value(ps, 0.4), norm(ps, 0.6)), shapes=OPEN, n=4, scale=3.0),
        # [schedule.hyper]: hyper-parameters set by hand before each step, as the recipes' loops do
        dict(id="torch-sgd-momentum-warmup", note="SGD(nesterov) whose momentum warms up as modded-nanogpt's "
             "Muon momentum does (frac = min(t / 3, 1); momentum = (1 − frac)·0.85 + frac·0.95, set in "
             "param_groups before step t)",
             tables={"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.95, "nesterov": True},
                     "schedule": {"name": "constant", "hyper": {"momentum": {
                         "name": "linear", "start_factor": 0.85 / 0.95, "end_factor": 1.0, "total_iters": 3}}}},
             sched=None, clip=None, hyper=_momentum_warmup(3), shapes=OPEN, n=6),
        dict(id="torch-muon-momentum-warmup", note="torch.optim.Muon (AdamW for the vector) with modded-nanogpt's "
             "momentum warm-up over 3 updates set in Muon's param_groups before each step",
             tables={"optimizer": {"name": "muon", "lr": 0.02, "momentum": 0.95},
                     "schedule": {"name": "constant", "hyper": {"momentum": {
                         "name": "linear", "start_factor": 0.85 / 0.95, "end_factor": 1.0, "total_iters": 3}}}},
             sched=None, clip=None, hyper=_momentum_warmup(3), shapes={"w": (3, 4), "b": (4,)}, n=5),
        dict(id="torch-adamw-wd-follows-lr", note="AdamW + CosineAnnealingLR(T_max=5) whose weight decay follows "
             "the lr (param_group weight_decay = 0.1 × lr_t / lr_0, set before each step from the scheduler's lr), "
             "two groups",
             tables={"optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.1,
                                   "groups": [{"params": ["head.*"], "lr": 0.01}]},
                     "schedule": {"name": "cosine", "t_max": 5, "hyper": {"weight_decay": {"name": "cosine",
                                                                                           "t_max": 5}}}},
             sched=lambda o: S.CosineAnnealingLR(o, T_max=5), clip=None, hyper=_wd_follows_lr(0.1),
             shapes=NAMED, n=6),
        dict(id="torch-adam-beta2-warmup-beta1-decay", note="Adam with beta2 = 0.9 + 0.09·min(t / 4, 1) and beta1 = "
             "0.9·0.8^t set in param_groups before step t (betas[1] warm-up, betas[0] exponential decay)",
             tables={"optimizer": {"name": "adam", "lr": 0.02, "betas": [0.9, 0.99]},
                     "schedule": {"name": "constant", "hyper": {
                         "beta2": {"name": "linear", "start_factor": 0.9 / 0.99, "end_factor": 1.0, "total_iters": 4},
                         "beta1": {"name": "exponential", "gamma": 0.8}}}},
             sched=None, clip=None, hyper=_betas(lambda t: 0.9 * 0.8**t, lambda t: 0.9 + 0.09 * min(t / 4, 1.0)),
             shapes=OPEN, n=6),
        dict(id="torch-adam-eps-decay", note="Adam(eps=1e-2) whose eps halves every update (param_group eps = "
             "1e-2·0.5^t set before step t), gradients of order 1e-2 so that eps weighs",
             tables={"optimizer": {"name": "adam", "lr": 0.05, "eps": 1e-2},
                     "schedule": {"name": "constant", "hyper": {"eps": {"name": "exponential", "gamma": 0.5}}}},
             sched=None, clip=None, hyper=_set("eps", lambda t: 1e-2 * 0.5**t), shapes=OPEN, n=6, scale=1e-2),
        dict(id="torch-rmsprop-alpha-warmup-centered", note="RMSprop(centered, momentum=0.5) whose alpha warms up "
             "0.9 → 0.99 (param_group alpha = 0.9 + 0.09·min(t / 4, 1) set before step t) as StepLR cycles the lr",
             tables={"optimizer": {"name": "rmsprop", "lr": 0.01, "alpha": 0.99, "centered": True, "momentum": 0.5},
                     "schedule": {"name": "step", "step_size": 2, "gamma": 0.5, "hyper": {"alpha": {
                         "name": "linear", "start_factor": 0.9 / 0.99, "end_factor": 1.0, "total_iters": 4}}}},
             sched=lambda o: S.StepLR(o, step_size=2, gamma=0.5), clip=None,
             hyper=_set("alpha", lambda t: 0.9 + 0.09 * min(t / 4, 1.0)), shapes=OPEN, n=6),
        dict(id="torch-sgd-dampening-cosine", note="SGD(momentum=0.9, dampening=0.5) whose dampening anneals to 0 "
             "(param_group dampening = 0.5·(1 + cos(πt/4))/2 set before step t)",
             tables={"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "dampening": 0.5},
                     "schedule": {"name": "constant", "hyper": {"dampening": {"name": "cosine", "t_max": 4}}}},
             sched=None, clip=None, hyper=_set("dampening", lambda t: 0.5 * (1 + math.cos(math.pi * t / 4)) / 2),
             shapes=OPEN, n=5),
        dict(id="optax-ademamix-beta3-alpha-schedules", note="optax.contrib.ademamix (b3, alpha as callables of its "
             "count, float64): β3 = 0.999·(0.99 + 0.01·min(t / 4, 1)) and α = 5·0.8^t, no warm-ups",
             tables={"optimizer": {"name": "ademamix", "lr": 0.05, "beta3": 0.999, "alpha": 5.0, "weight_decay": 0.1},
                     "schedule": {"name": "constant", "hyper": {
                         "beta3": {"name": "linear", "start_factor": 0.99, "end_factor": 1.0, "total_iters": 4},
                         "alpha": {"name": "exponential", "gamma": 0.8}}}},
             native=_ademamix(0.05, 0.1, lambda c: 0.999 * (0.99 + 0.01 * np.minimum(c / 4, 1.0)),
                              lambda c: 5.0 * 0.8**c), shapes=OPEN, n=6),
        dict(id="optax-ademamix-alpha-warmup-and-decay", note="optax.contrib.ademamix with apple/ml-ademamix's α "
             "warm-up over 3 updates (t/3·α_t while t = count + 1 < 3) of an α that decays as 4·(1 + cos(πc/6))/2 "
             "at update c: the warm-up reads the scheduled value, as the reference reads param_group alpha",
             tables={"optimizer": {"name": "ademamix", "lr": 0.05, "beta3": 0.99, "alpha": 4.0, "alpha_warmup": 3},
                     "schedule": {"name": "constant", "hyper": {"alpha": {"name": "cosine", "t_max": 6}}}},
             native=_ademamix(0.05, 0.0, lambda c: 0.99 + 0.0 * c,
                              lambda c: np.where(c + 1 < 3, (c + 1) / 3, 1.0) * 4.0 * (1 + np.cos(np.pi * c / 6)) / 2),
             shapes=OPEN, n=6),
        dict(id="optax-adamw-then-clip-by-global-norm", note="optax.chain(optax.adamw(0.1, weight_decay=0.1), "
             "optax.clip_by_global_norm(0.25)): the clip after the optimizer clips its updates (lr and decay "
             "included), here in some updates and not in others",
             tables={"optimizer": {"name": "adamw", "lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
                     "clip": {"max_norm": 0.25, "eps": 0.0, "target": "updates"}},
             native=_optax_chain(lambda optax: optax.chain(optax.adamw(0.1, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1),
                                                           optax.clip_by_global_norm(0.25))),
             shapes=OPEN, n=6),
        dict(id="optax-sgd-momentum-then-clip", note="optax.chain(optax.sgd(0.2, momentum=0.9), optax.clip(0.03)): "
             "every element of the update clamped to [-0.03, 0.03], the momentum buffer kept unclamped",
             tables={"optimizer": {"name": "sgd", "lr": 0.2, "momentum": 0.9},
                     "clip": {"clip_value": 0.03, "target": "updates"}},
             native=_optax_chain(lambda optax: optax.chain(optax.sgd(0.2, momentum=0.9), optax.clip(0.03))),
             shapes=OPEN, n=5),
        dict(id="optax-adam-then-clip-value-and-norm", note="optax.chain(optax.adam(0.1), optax.clip(0.04), "
             "optax.clip_by_global_norm(0.1)): the updates clamped, then clipped by the clamped updates' norm",
             tables={"optimizer": {"name": "adam", "lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-8},
                     "clip": {"clip_value": 0.04, "max_norm": 0.1, "eps": 0.0, "target": "updates"}},
             native=_optax_chain(lambda optax: optax.chain(optax.adam(0.1, b1=0.9, b2=0.999, eps=1e-8), optax.clip(0.04),
                                                           optax.clip_by_global_norm(0.1))),
             shapes=OPEN, n=5),
        dict(id="prodigyopt-prodigy-cosine-clip", note="prodigyopt.Prodigy(d0=1e-3, weight_decay=0.05, "
             "use_bias_correction=True; biases without decay: two groups, one d) + CosineAnnealingLR(T_max=6) + "
             "clip_grad_norm_(max_norm=0.5): the scheduler scales Prodigy's lr multiplier",
             tables={"optimizer": {"name": "prodigy", "d0": 1e-3, "weight_decay": 0.05, "use_bias_correction": True,
                                   "no_weight_decay": ["*.bias"]},
                     "schedule": {"name": "cosine", "t_max": 6}, "clip": {"max_norm": 0.5}},
             sched=lambda o: S.CosineAnnealingLR(o, T_max=6), clip=lambda ps: norm(ps, 0.5), shapes=NAMED, n=7,
             peer="prodigyopt"),
    ]


def _optax_chain(build: Callable[[Any], Any]) -> Native:
    """The optax transform build(optax) run in float64 (x64): p ← optax.apply_updates(p, updates)."""
    def run(params: dict[str, np.ndarray], grads: list[dict[str, np.ndarray]]) -> list[dict]:
        import jax
        import jax.numpy as jnp
        import optax

        with jax.enable_x64(True):
            tx = build(optax)
            p = {k: jnp.asarray(np.asarray(v, np.float64)) for k, v in params.items()}
            state, out = tx.init(p), []
            for g in grads:
                u, state = tx.update({k: jnp.asarray(np.asarray(v, np.float64)) for k, v in g.items()}, state, p)
                p = optax.apply_updates(p, u)
                out.append({k: np.asarray(v) for k, v in p.items()})
        return out
    return run


def _momentum_warmup(steps: int) -> Hyper:
    # modded-nanogpt's train_gpt.py: frac = min(step / 300, 1); momentum = (1 - frac) * 0.85 + frac * 0.95
    return _set("momentum", lambda t: (1 - min(t / steps, 1.0)) * 0.85 + min(t / steps, 1.0) * 0.95)


def _wd_follows_lr(wd: float) -> Hyper:
    def set_wd(opts: list[torch.optim.Optimizer], t: int) -> None:
        for group in opts[0].param_groups:
            group["weight_decay"] = wd * group["lr"] / group["initial_lr"]
    return set_wd


def _set(key: str, value: Callable[[int], float]) -> Hyper:
    def set_key(opts: list[torch.optim.Optimizer], t: int) -> None:
        for group in opts[0].param_groups:
            group[key] = value(t)
    return set_key


def _ademamix(lr: float, wd: float, b3: Callable[[Any], Any], alpha: Callable[[Any], Any]) -> Native:
    """optax.contrib.ademamix in float64 with β3 and α as functions of its count (the update's index,
    read before its increment), cast to float64 first (optax's count is int32)."""
    def build(optax: Any) -> Any:
        import jax.numpy as jnp

        return optax.contrib.ademamix(lr, b3=lambda c: b3(jnp.asarray(c, jnp.float64)),
                                      alpha=lambda c: alpha(jnp.asarray(c, jnp.float64)), weight_decay=wd)
    return _optax_chain(build)


def _betas(beta1: Callable[[int], float], beta2: Callable[[int], float]) -> Hyper:
    def set_betas(opts: list[torch.optim.Optimizer], t: int) -> None:
        for group in opts[0].param_groups:
            group["betas"] = (beta1(t), beta2(t))
    return set_betas


def generate(out: Path) -> list[Path]:
    rng = np.random.default_rng(12)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for c in bundled():
        params = _rng_params(rng, c["shapes"])
        grads = [{k: v * c.get("scale", 1.0) for k, v in _rng_params(rng, c["shapes"]).items()} for _ in range(c["n"])]
        if "native" in c:
            expected = c["native"](params, grads)
            source = f"generated by tools/gen_update_cases.py from optax in float64: {c['note']}"
        else:
            expected = native_trajectory(c["tables"]["optimizer"], c["sched"], c["clip"], params, grads, c.get("hyper"),
                                         c.get("peer"))
            optimizer = "prodigyopt 1.1.2" if c.get("peer") else "torch.optim"
            source = (f"generated by tools/gen_update_cases.py from {optimizer} + lr_scheduler + torch.nn.utils "
                      f"clipping in float64: {c['note']}")
        path = out / f"{c['id']}.toml"
        write_case(path, f"optimizer/{c['id']}", source, c["tables"], params, grads, expected)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"output directory (default: {OUT})")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
