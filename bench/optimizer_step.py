"""Optimizer step cost: twinstep against the bare framework built-ins, on a ~10M-parameter set.

    python bench/optimizer_step.py [--optimizers adam,sgd,...] [--repeats 7] [--steps 10] [--device cpu|cuda]

Torch: `ref_torch.optimizers.build_optimizer(spec, named_params)` (the torch.optim class twinstep
picks, with its parameter groups, names and hooks) against `torch.optim.<Class>(params, **kwargs)`
built by hand (adamw_cwd: heavyball's AdamW with cautious_weight_decay, eager; prodigy: prodigyopt's Prodigy). JAX: twinstep's optimizer (per-parameter state, injectable group hyper-parameters)
in a jitted step against the closest optax alias in the same jitted step (the ratio measures
twinstep's JAX plumbing; the arithmetic is torch's, so the aliases are not all numerically equal:
docs/divergences.md#optimizers). Measurements alternate twinstep and baseline, repeat, and
report median times and the median of the paired ratios; ratios near 1.00 mean no overhead. Nothing here is a test: timings are printed.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

SHAPES = {**{f"h.{i}.weight": (1024, 1024) for i in range(9)}, **{f"h.{i}.bias": (1024,) for i in range(9)},
          "head.weight": (512, 1024), "head.bias": (512,)}
SPECS: dict[str, dict[str, Any]] = {
    "sgd": {"name": "sgd", "lr": 0.01, "momentum": 0.9}, "adam": {"name": "adam", "lr": 1e-3},
    "adamw": {"name": "adamw", "lr": 1e-3}, "rmsprop": {"name": "rmsprop", "lr": 1e-3},
    "adagrad": {"name": "adagrad", "lr": 1e-2}, "nadam": {"name": "nadam"}, "adafactor": {"name": "adafactor"},
    "lion": {"name": "lion", "lr": 1e-4}, "muon": {"name": "muon", "lr": 0.02},
    "schedule_free_adamw": {"name": "schedule_free_adamw", "lr": 1e-3},
    "schedule_free_sgd": {"name": "schedule_free_sgd", "lr": 0.1},
    "ademamix": {"name": "ademamix", "lr": 1e-3},
    "adamw_cwd": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.1, "cautious_weight_decay": True},
    "prodigy": {"name": "prodigy", "weight_decay": 0.01},
}


def _time(fn: Callable[[], Any], steps: int, sync: Callable[[], Any]) -> float:
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) / steps


def bench_torch(name: str, steps: int, repeats: int, device: str) -> tuple[float, float, float] | None:
    import torch

    from conformance.config import load_config
    from ref_torch.optimizers import build_optimizer

    bare_classes = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
                    "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad, "nadam": torch.optim.NAdam,
                    "adafactor": torch.optim.Adafactor}
    try:
        import schedulefree  # the package is the built-in of the schedule-free optimizers

        bare_classes.update(schedule_free_adamw=schedulefree.AdamWScheduleFree,
                            schedule_free_sgd=schedulefree.SGDScheduleFree)
    except ImportError:
        pass
    try:
        import pytorch_optimizer  # the torch peer with an AdEMAMix (`pip install pytorch-optimizer==4.1.0`)

        bare_classes["ademamix"] = pytorch_optimizer.AdEMAMix
    except ImportError:
        pass
    try:
        import heavyball  # the torch peer with cautious weight decay (`pip install heavyball==3.2.1`)

        heavyball.utils.compile_mode = None  # eager, as twinstep's torch step (its inductor kernels: a gcc ICE here)
        bare_classes["adamw_cwd"] = lambda ps, **kw: heavyball.AdamW(list(ps), compile_step=False, **kw)
        accepted_cwd = {"lr", "betas", "eps", "weight_decay", "cautious_weight_decay"}
    except ImportError:
        accepted_cwd = set()
    try:
        import prodigyopt  # the torch peer whose Prodigy twinstep's follows (`pip install prodigyopt==1.1.2`)

        bare_classes["prodigy"] = prodigyopt.Prodigy
    except ImportError:
        pass
    if name not in bare_classes:
        return None  # no torch built-in to compare with (lion: twinstep's own class; muon: two optimizers;
                    # ademamix without pytorch-optimizer)
    spec = load_config({"optimizer": SPECS[name]}).optimizer
    # twinstep's extra fields stay out (heavyball's AdamW: eager, compile_step=False, as twinstep's torch step)
    accepted = accepted_cwd if name == "adamw_cwd" else inspect.signature(bare_classes[name]).parameters
    kwargs = {k: v for k, v in spec.overrides().items() if k in accepted}
    if name == "adafactor":
        kwargs["eps"] = (None, kwargs["eps"][1])
    if name == "ademamix":  # the peer's betas are (β1, β2, β3); without warm-ups or decay its math is ours
        kwargs["betas"] = (*kwargs["betas"], spec.beta3)

    def make(ours: bool) -> Callable[[], None]:
        g = torch.Generator().manual_seed(0)
        params = {k: torch.nn.Parameter(torch.randn(s, generator=g).to(device)) for k, s in SHAPES.items()}
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=g).to(device) * 1e-2
        opt = build_optimizer(spec, params.items()) if ours else bare_classes[name](params.values(), **kwargs)
        if hasattr(opt, "train"):
            opt.train()  # schedulefree's optimizers step in train mode only
        if name != "adamw_cwd":
            return opt.step
        grads = {k: p.grad for k, p in params.items()}

        def step() -> None:  # heavyball drops p.grad after its step: both sides get theirs back first
            for k, p in params.items():
                p.grad = grads[k]
            opt.step()
        return step

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ours, bare = make(True), make(False)
    return _summary([(_time(ours, steps, sync), _time(bare, steps, sync)) for _ in range(repeats)])


def _summary(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median times, and the median of the paired ratios (each pair ran back to back, so load
    changes on a shared machine cancel in the ratio)."""
    return (statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs),
            statistics.median(p[0] / p[1] for p in pairs))


def bench_jax(name: str, steps: int, repeats: int) -> tuple[float, float, float]:
    import jax
    import optax

    from conformance.config import load_config
    from ref_jax.optimizers import build_optimizer

    spec = load_config({"optimizer": SPECS[name]}).optimizer
    hp = spec.overrides()
    aliases = {
        "sgd": lambda: optax.sgd(hp["lr"], momentum=hp["momentum"]),
        "adam": lambda: optax.adam(hp["lr"]),
        "adamw": lambda: optax.adamw(hp["lr"], weight_decay=hp["weight_decay"]),
        "rmsprop": lambda: optax.rmsprop(hp["lr"], decay=hp["alpha"], eps_in_sqrt=False),
        "adagrad": lambda: optax.adagrad(hp["lr"], initial_accumulator_value=0.0, eps=hp["eps"]),
        "nadam": lambda: optax.nadam(hp["lr"]),
        "adafactor": lambda: optax.adafactor(hp["lr"], min_dim_size_to_factor=1),
        "lion": lambda: optax.lion(hp["lr"], weight_decay=0.0),
        "muon": lambda: optax.contrib.muon(hp["lr"]),
        "schedule_free_adamw": lambda: optax.contrib.schedule_free_adamw(hp["lr"]),
        "schedule_free_sgd": lambda: optax.contrib.schedule_free_sgd(hp["lr"], b1=hp["momentum"]),
        "ademamix": lambda: optax.contrib.ademamix(hp["lr"], b3=hp["beta3"], alpha=hp["alpha"]),
        # optax has no cautious weight decay: the plain decay, so the ratio is the mask's cost
        "adamw_cwd": lambda: optax.adamw(hp["lr"], weight_decay=hp["weight_decay"]),
        # always bias-corrected, no growth cap: the same work per step as prodigyopt's defaults
        "prodigy": lambda: optax.contrib.prodigy(hp["lr"], hp["betas"], hp["beta3"], hp["eps"], estim_lr0=hp["d0"],
                                                 weight_decay=hp["weight_decay"]),
    }
    key = jax.random.PRNGKey(0)
    params = {k: jax.random.normal(jax.random.fold_in(key, i), s) for i, (k, s) in enumerate(SHAPES.items())}
    grads = {k: 1e-2 * jax.random.normal(jax.random.fold_in(key, 100 + i), s) for i, (k, s) in enumerate(SHAPES.items())}

    def make(tx: Any) -> Callable[[], None]:
        @jax.jit
        def step(p: Any, s: Any) -> Any:
            u, s = tx.update(grads, s, p)
            return optax.apply_updates(p, u), s

        box = [params, tx.init(params)]

        def run() -> Any:
            box[0], box[1] = step(box[0], box[1])
            return box

        return run

    ours, bare = make(build_optimizer(spec, params)), make(aliases[name]())

    def timed(fn: Callable[[], Any]) -> float:
        jax.block_until_ready(fn())  # compiled and warm
        t0 = time.perf_counter()
        for _ in range(steps):
            out = fn()
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / steps

    return _summary([(timed(ours), timed(bare)) for _ in range(repeats)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizers", default="sgd,adam,adamw,rmsprop,adagrad,nadam,adafactor,lion,"
                                            "schedule_free_adamw,schedule_free_sgd,ademamix,adamw_cwd,prodigy")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--skip-jax", action="store_true")
    args = ap.parse_args(argv)
    n = sum(int(np.prod(s)) for s in SHAPES.values())
    print(f"{n / 1e6:.1f}M parameters in {len(SHAPES)} tensors, float32, {args.device}; median of {args.repeats} "
          f"interleaved runs of {args.steps} steps")
    print(f"{'optimizer':<10} {'torch ms':>9} {'bare ms':>8} {'ratio':>6}   {'jax ms':>8} {'optax ms':>9} {'ratio':>6}")
    for name in args.optimizers.split(","):
        t = bench_torch(name, args.steps, args.repeats, args.device)
        j = None if args.skip_jax else bench_jax(name, args.steps, args.repeats)
        tt = f"{t[0] * 1e3:9.2f} {t[1] * 1e3:8.2f} {t[2]:6.2f}" if t else f"{'-':>9} {'-':>8} {'-':>6}"
        jj = f"{j[0] * 1e3:8.2f} {j[1] * 1e3:9.2f} {j[2]:6.2f}" if j else ""
        print(f"{name:<10} {tt}   {jj}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
