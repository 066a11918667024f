"""Shared helpers of the porting tests (no tests here): native torch.optim / lr_scheduler set-ups built
with torch's own classes only, and runs of a spec on both backends against them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.optim import lr_scheduler as sched

from conformance.config import Config, load_config
from conformance.harness.backends import Backend
from conformance.port import from_torch
from conformance.port.verify.native import run_native_torch
from conformance.port.verify.traces import Trace, gradient_stream, run_backend

SHAPES = {"enc.weight": (3, 4), "enc.bias": (3,), "head.weight": (2, 3), "head.bias": (2,)}
MATRICES = {"enc.weight": (3, 4), "head.weight": (2, 3)}  # Muon takes 2-D parameters only


def initial(shapes: dict[str, tuple[int, ...]] = SHAPES, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=s) for k, s in shapes.items()}


def parameters(values: dict[str, np.ndarray]) -> dict[str, torch.nn.Parameter]:
    return {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float64)) for k, v in values.items()}


# torch.optim class, options of the default group, options of the bias group (two param groups)
OPTIMIZERS: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01), dict(lr=0.02, dampening=0.0)),
    "sgd-nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True), dict(weight_decay=0.1)),
    "adam": (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True), dict(lr=0.02)),
    "adam-decoupled": (torch.optim.Adam, dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1), dict(amsgrad=True)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1), dict(weight_decay=0.0)),
    "rmsprop": (torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, eps=1e-6, momentum=0.5, centered=True), dict(centered=False)),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.2, eps=1e-8), dict(lr_decay=0.0)),
    "adamax": (torch.optim.Adamax, dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.05), dict(eps=1e-4)),
    "nadam": (torch.optim.NAdam, dict(lr=0.01, momentum_decay=0.01, weight_decay=0.1), dict(decoupled_weight_decay=True)),
    "radam": (torch.optim.RAdam, dict(lr=0.01, betas=(0.9, 0.9), weight_decay=0.1), dict(decoupled_weight_decay=True)),
    "adafactor": (torch.optim.Adafactor, dict(lr=0.01, beta2_decay=-0.7, d=2.0, weight_decay=0.1), dict(eps=(1e-5, 1e-2))),
    "muon": (torch.optim.Muon, dict(lr=0.01, momentum=0.9, weight_decay=0.05), dict(nesterov=False)),
}
try:  # the schedulefree package (an optional extra): its optimizers are ported too
    import schedulefree

    OPTIMIZERS["schedule-free-adamw"] = (schedulefree.AdamWScheduleFree, dict(lr=0.01, warmup_steps=2, weight_decay=0.1,
                                                                         foreach=False), dict(lr=0.02, r=0.5))
    OPTIMIZERS["schedule-free-sgd"] = (schedulefree.SGDScheduleFree, dict(lr=0.1, momentum=0.8, foreach=False),
                                       dict(weight_lr_power=1.0))
except ImportError:
    pass


def optimizer(kind: str, named: dict[str, torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Two param groups: the biases (first, with the override options) and the rest (default)."""
    cls, options, bias_options = OPTIMIZERS[kind]
    if kind == "muon":
        groups = [{"params": [named["head.weight"]], **bias_options}, {"params": [named["enc.weight"]]}]
    else:
        groups = [{"params": [p for n, p in named.items() if n.endswith("bias")], **bias_options},
                  {"params": [p for n, p in named.items() if not n.endswith("bias")]}]
    opt = cls(groups, **options)
    if hasattr(opt, "train"):
        opt.train()  # schedulefree: steps in train mode only
    return opt


SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "none": lambda o: None,
    "constant": lambda o: sched.ConstantLR(o, factor=0.5, total_iters=3),
    "step": lambda o: sched.StepLR(o, step_size=2, gamma=0.5),
    "multistep": lambda o: sched.MultiStepLR(o, milestones=[2, 5], gamma=0.3),
    "exponential": lambda o: sched.ExponentialLR(o, gamma=0.9),
    "cosine": lambda o: sched.CosineAnnealingLR(o, T_max=4, eta_min=1e-3),
    "linear": lambda o: sched.LinearLR(o, start_factor=0.2, end_factor=0.9, total_iters=4),
    "polynomial": lambda o: sched.PolynomialLR(o, total_iters=6, power=2.0),
    "onecycle": lambda o: sched.OneCycleLR(o, max_lr=[0.02, 0.05], total_steps=14, pct_start=0.25),
    "onecycle-3-linear": lambda o: sched.OneCycleLR(o, max_lr=0.05, total_steps=14, pct_start=0.3, three_phase=True,
                                                    anneal_strategy="linear", div_factor=10.0, final_div_factor=100.0),
    "restarts": lambda o: sched.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2, eta_min=1e-3),
    "sequential": lambda o: sched.SequentialLR(o, [sched.LinearLR(o, 0.1, 1.0, 3), sched.ExponentialLR(o, 0.8)], [3]),
    "warmup-cosine": lambda o: sched.SequentialLR(
        o, [sched.LinearLR(o, 0.1, 1.0, 3), sched.CosineAnnealingLR(o, T_max=7, eta_min=1e-4)], [3]),
    "chained-one": lambda o: sched.ChainedScheduler([sched.StepLR(o, step_size=3, gamma=0.5)]),
    "chained": lambda o: sched.ChainedScheduler([sched.LinearLR(o, 0.2, 1.0, 4), sched.ExponentialLR(o, 0.9),
                                                 sched.CosineAnnealingLR(o, T_max=30)]),
    "cyclic": lambda o: sched.CyclicLR(o, 0.01, 0.05, step_size_up=3, mode="triangular2", cycle_momentum=False),
    "cyclic-exp-range": lambda o: sched.CyclicLR(o, [0.005, 0.01][-len(o.param_groups):], 0.08, step_size_up=2,
                                                 step_size_down=4, mode="exp_range", gamma=0.9, cycle_momentum=False),
    "cyclic-momentum": lambda o: sched.CyclicLR(o, 0.01, 0.05, step_size_up=3, base_momentum=0.85, max_momentum=0.95),
    "plateau": lambda o: sched.ReduceLROnPlateau(o, mode="max", patience=2, min_lr=1e-4),
    # transformers' LambdaLRs (conformance/port/read/hf_sched.py)
    "hf-constant": lambda o: hf_schedule("get_constant_schedule", o),
    "hf-constant-warmup": lambda o: hf_schedule("get_constant_schedule_with_warmup", o, 3),
    "hf-polynomial": lambda o: hf_schedule("get_polynomial_decay_schedule_with_warmup", o, 3, 9, lr_end=1e-3, power=2.0),
    "hf-polynomial-no-warmup": lambda o: hf_schedule("get_polynomial_decay_schedule_with_warmup", o, 0, 8, power=0.5),
    "hf-linear-warmup": lambda o: hf_schedule("get_linear_schedule_with_warmup", o, 3, 9),
    "hf-cosine-warmup": lambda o: hf_schedule("get_cosine_schedule_with_warmup", o, 3, 9),  # climbs back after 9
    "hf-cosine-one-cycle": lambda o: hf_schedule("get_cosine_schedule_with_warmup", o, 2, 10, num_cycles=1.0),
    "hf-cosine-min-lr": lambda o: hf_schedule("get_cosine_with_min_lr_schedule_with_warmup", o, 0, 8, min_lr_rate=0.1),
    "hf-inverse-sqrt": lambda o: hf_schedule("get_inverse_sqrt_schedule", o, 4, timescale=6),
    # 3 cycles of 3 updates after 3 of warm-up; exact up to update 12, where transformers' lr drops to 0
    "hf-cosine-hard-restarts": lambda o: hf_schedule("get_cosine_with_hard_restarts_schedule_with_warmup", o, 3, 12,
                                                     num_cycles=3),
    "hf-wsd-cosine": lambda o: hf_schedule("get_wsd_schedule", o, 2, 3, num_stable_steps=4, min_lr_ratio=0.1),
    "hf-wsd-1-sqrt": lambda o: hf_schedule("get_wsd_schedule", o, 0, 4, num_training_steps=9, decay_type="1-sqrt"),
    "hf-wsd-linear": lambda o: hf_schedule("get_wsd_schedule", o, 3, 4, num_stable_steps=1, decay_type="linear"),
    "hf-in-sequential": lambda o: sched.SequentialLR(o, [hf_schedule("get_linear_schedule_with_warmup", o, 2, 6),
                                                         sched.ExponentialLR(o, 0.8)], [6]),
}


def hf_schedule(name: str, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
    from transformers import optimization  # the test extra; a LambdaLR of one of its schedule functions

    return getattr(optimization, name)(optimizer, *args, **kwargs)
NEEDS_MOMENTUM = ("cyclic-momentum",)  # CyclicLR(cycle_momentum=True) refuses an optimizer without momentum or betas


@contextlib.contextmanager
def float64_default() -> Iterator[None]:
    """torch's default dtype float64 (native NAdam keeps mu_product in the default dtype: O-NADAM-F32)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def config_of(sections: dict[str, Any]) -> Config:
    return load_config({**sections, "precision": {"dtype": "float64"}})


def on_backends(config: Config, values: dict[str, np.ndarray], windows: list, position: int = 0,
                frameworks: tuple[str, ...] = ("torch", "jax")) -> dict[str, Trace]:
    out = {}
    for name in frameworks:
        with Backend(name).context():
            out[name] = run_backend(name, config, values, windows, position)
    return out


def native_run(kind: str, schedule: str | Callable[[torch.optim.Optimizer], Any], updates: int = 10,
               pre_steps: int = 0, seed: int = 0, **read: Any
               ) -> tuple[dict[str, Any], int, dict[str, np.ndarray], list, Trace]:
    """Build a native set-up (`schedule`: a SCHEDULERS name or a maker), step its scheduler
    `pre_steps` times (no gradients), translate it (from_torch keywords `read`), then run it
    natively: (spec sections, position, initial values, stream, native trace)."""
    shapes = MATRICES if kind == "muon" else SHAPES
    values = initial(shapes, seed)
    named = parameters(values)
    opt = optimizer(kind, named)
    scheduler = (SCHEDULERS[schedule] if isinstance(schedule, str) else schedule)(opt)
    for _ in range(pre_steps):
        opt.step()  # no gradients: parameters and optimizer state stay as they are
        scheduler.step()
    spec = from_torch(opt, scheduler, named, **read)
    windows = gradient_stream(shapes, updates, seed=seed + 1)
    want = run_native_torch(opt, scheduler, named, windows)
    return dict(spec), spec.position, values, windows, want
