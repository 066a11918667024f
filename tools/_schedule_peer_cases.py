"""The schedule cases whose expected values come from the peers' own built-ins.

Called by tools/gen_schedule_cases.py (bundled_cases). torch 2.13's ChainedScheduler, CyclicLR (all
three modes, with and without momentum / beta1 cycling) and ReduceLROnPlateau (min/rel, max/abs,
cooldown, min_lr, eps) stepped in float64; Keras's own CosineDecayRestarts tests (test_decay,
test_alpha, test_mmul, test_tmul: their reference np_cosine_decay_restarts in float64, at the steps
the tests use); optax's end values and starts above the peak (polynomial_schedule, exponential_decay
with end_value, staircase and transition_begin, linear_schedule and warmup_cosine_decay_schedule
from above the peak) on a float64 count. Never twinstep's code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optax
import torch
from _schedule_refs import keras_restarts, optax_values
from torch.optim import lr_scheduler as S

TORCH = f"torch {torch.__version__.split('+')[0]}"
OPTAX = f"optax {optax.__version__}"
KERAS = "Keras 3.15.1 keras/src/optimizers/schedules/learning_rate_schedule_test.py CosineDecayRestartsTest"

Write = Callable[..., None]


def _metrics(seed: int, n: int, start: float = 1.0, drift: float = -0.01, noise: float = 0.02) -> list[float]:
    # a noisy validation curve that improves, then flattens: plateaus for the scheduler to find
    r = np.random.default_rng(seed)
    t = np.arange(n)
    curve = start + drift * np.minimum(t, n // 3) + noise * r.standard_normal(n)
    return [float(round(x, 6)) for x in curve]


def chained_cases(out: Path, tc: Callable[..., None]) -> None:
    tc(out, "chained-linear-cosine", "ChainedScheduler([LinearLR(0.01, 1, 10), CosineAnnealingLR(100)]): the "
       "warm-up's factor times the cosine's (reference/semantics.md §3), not warmup_cosine",
       {"name": "chained", "schedulers": [{"name": "linear", "start_factor": 0.01, "end_factor": 1.0,
                                           "total_iters": 10}, {"name": "cosine", "t_max": 100}]},
       lambda o: S.ChainedScheduler([S.LinearLR(o, 0.01, 1.0, 10), S.CosineAnnealingLR(o, 100)]), 101)
    tc(out, "chained-constant-exponential-groups", "ConstantLR(0.5, 4) × ExponentialLR(0.9), two groups",
       {"name": "chained", "schedulers": [{"name": "constant", "factor": 0.5, "total_iters": 4},
                                          {"name": "exponential", "gamma": 0.9}]},
       lambda o: S.ChainedScheduler([S.ConstantLR(o, 0.5, 4), S.ExponentialLR(o, 0.9)]), 12, groups=(0.03,))
    tc(out, "chained-step-multistep-polynomial", "StepLR × MultiStepLR × PolynomialLR(power 2): three factors",
       {"name": "chained", "schedulers": [{"name": "step", "step_size": 3, "gamma": 0.8},
                                          {"name": "multistep", "milestones": [2, 7], "gamma": 0.5},
                                          {"name": "polynomial", "total_iters": 12, "power": 2.0}]},
       lambda o: S.ChainedScheduler([S.StepLR(o, 3, 0.8), S.MultiStepLR(o, [2, 7], 0.5), S.PolynomialLR(o, 12, 2.0)]),
       15)
    tc(out, "chained-per-epoch", "per epoch of 3 updates: LinearLR(0.2, 1, 3) × StepLR(2, 0.5)",
       {"name": "chained", "unit": "epoch", "schedulers": [{"name": "linear", "start_factor": 0.2, "total_iters": 3},
                                                           {"name": "step", "step_size": 2, "gamma": 0.5}]},
       lambda o: S.ChainedScheduler([S.LinearLR(o, 0.2, 1.0, 3), S.StepLR(o, 2, 0.5)]), 21, upe=3)
    tc(out, "sequential-chained-first", "SequentialLR([ChainedScheduler([LinearLR(0.2, 1, 3), StepLR(2, 0.5), "
       "ConstantLR(0.5, 2), MultiStepLR([1, 3], 0.5)]), ConstantLR(0.5, 3)], [6]): a chained first part runs as the "
       "ChainedScheduler alone (torch refuses later chained parts: NotImplementedError at their milestone)",
       {"name": "sequential", "milestones": [6], "schedulers": [
           {"name": "chained", "schedulers": [{"name": "linear", "start_factor": 0.2, "total_iters": 3},
                                              {"name": "step", "step_size": 2, "gamma": 0.5},
                                              {"name": "constant", "factor": 0.5, "total_iters": 2},
                                              {"name": "multistep", "milestones": [1, 3], "gamma": 0.5}]},
           {"name": "constant", "factor": 0.5, "total_iters": 3}]},
       lambda o: S.SequentialLR(o, [S.ChainedScheduler([S.LinearLR(o, 0.2, 1.0, 3), S.StepLR(o, 2, 0.5),
                                                        S.ConstantLR(o, 0.5, 2), S.MultiStepLR(o, [1, 3], 0.5)]),
                                    S.ConstantLR(o, 0.5, 3)], [6]), 12, groups=(0.03,))


def cyclic_cases(out: Path, tc: Callable[..., None]) -> None:
    def cyc(**kw: Any) -> dict[str, Any]:
        return {"name": "cyclic", **kw}

    tc(out, "cyclic-triangular-sgd-momentum", "CyclicLR triangular, SGD momentum cycled 0.9 -> 0.8 -> 0.9; "
       "base_lr overrides the optimizer's lr (CyclicLR writes it into every group)",
       cyc(base_lr=0.01, max_lr=0.1, step_size_up=4), lambda o: S.CyclicLR(o, 0.01, 0.1, 4), 20, lr=0.5)
    tc(out, "cyclic-triangular2-no-momentum", "triangular2: the amplitude halves every cycle; step_size_down "
       "differs; no momentum cycling", cyc(base_lr=0.001, max_lr=0.05, step_size_up=3, step_size_down=5,
                                           mode="triangular2", cycle_momentum=False),
       lambda o: S.CyclicLR(o, 0.001, 0.05, 3, 5, mode="triangular2", cycle_momentum=False), 40)
    tc(out, "cyclic-exp-range-adam-beta1", "exp_range (amplitude × gamma^t), Adam's beta1 cycled 0.95 -> 0.85",
       cyc(base_lr=0.002, max_lr=0.02, step_size_up=5, mode="exp_range", gamma=0.97, base_momentum=0.85,
           max_momentum=0.95), lambda o: S.CyclicLR(o, 0.002, 0.02, 5, mode="exp_range", gamma=0.97,
                                                     base_momentum=0.85, max_momentum=0.95), 30, opt="adam")
    tc(out, "cyclic-groups-own-base", "no base_lr: each group cycles up from its own lr (torch's base_lr list) "
       "to max_lr; RMSprop's momentum cycled", cyc(max_lr=0.2, step_size_up=2, step_size_down=3),
       lambda o: S.CyclicLR(o, [0.01, 0.05], 0.2, 2, 3), 16, lr=0.05, groups=(0.01,), opt="rmsprop")
    tc(out, "cyclic-exp-range-per-epoch", "per epoch of 2 updates, exp_range without momentum",
       cyc(unit="epoch", base_lr=0.01, max_lr=0.1, step_size_up=2, mode="exp_range", gamma=0.9, cycle_momentum=False),
       lambda o: S.CyclicLR(o, 0.01, 0.1, 2, mode="exp_range", gamma=0.9, cycle_momentum=False), 24, upe=2)
    at = [0, 1, 999, 1000, 1999, 2000, 2001, 3333, 5999]
    tc(out, "cyclic-triangular2-spots", "spot values (inputs.at) over 6000 updates of torch's default step "
       "sizes (2000 up and down): the amplitude halves every 4000 updates",
       cyc(base_lr=0.001, max_lr=0.006, mode="triangular2"),
       lambda o: S.CyclicLR(o, 0.001, 0.006, mode="triangular2"), 6000, at=at)


def plateau_cases(out: Path, tc: Callable[..., None]) -> None:
    def rop(**kw: Any) -> dict[str, Any]:
        return {"name": "reduce_on_plateau", **kw}

    m1 = _metrics(1, 60)
    tc(out, "plateau-min-rel-cooldown-min-lr", "ReduceLROnPlateau min/rel, patience 3, cooldown 2, min_lr 1e-3: a "
       "noisy validation loss that flattens", rop(factor=0.5, patience=3, cooldown=2, min_lr=1e-3),
       lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=3, cooldown=2, min_lr=1e-3), 60, metrics=m1)
    acc = [float(round(50 + 40 * (1 - np.exp(-t / 8)) + np.sin(3 * t), 4)) for t in range(50)]
    tc(out, "plateau-max-abs-cooldown-min-lr-groups", "max/abs (an accuracy in percent), threshold 0.5, cooldown 1, "
       "min_lr 2e-3, two groups (the smaller reaches min_lr first)",
       rop(mode="max", threshold_mode="abs", threshold=0.5, factor=0.3, patience=2, cooldown=1, min_lr=2e-3),
       lambda o: S.ReduceLROnPlateau(o, mode="max", threshold_mode="abs", threshold=0.5, factor=0.3, patience=2,
                                     cooldown=1, min_lr=2e-3), 50, groups=(0.01,), metrics=acc)
    flat = [1.0] * 30
    tc(out, "plateau-eps-stops-small-reductions", "eps = 0.004: a reduction by less than eps is skipped (the 0.005 "
       "group falls once, to 0.0005, the 0.1 group to 0.001, then neither moves)", rop(patience=0, eps=0.004),
       lambda o: S.ReduceLROnPlateau(o, patience=0, eps=0.004), 30, groups=(0.005,), metrics=flat)
    tc(out, "plateau-max-rel-defaults", "max/rel with torch's defaults (patience 10, factor 0.1)",
       rop(mode="max"), lambda o: S.ReduceLROnPlateau(o, mode="max"), 40,
       metrics=[float(round(0.3 + 0.01 * min(t, 12) + 0.001 * ((t * 7) % 5), 6)) for t in range(40)])
    negative = [-1.0] * 25
    tc(out, "plateau-min-rel-negative-metric", "min/rel with a constant negative metric: best·(1 − threshold) "
       "lies above best, so every value counts as better and the lr never falls (optax PR #1767's complaint; "
       "torch does the same)", rop(patience=2), lambda o: S.ReduceLROnPlateau(o, patience=2), 25, metrics=negative)
    tc(out, "plateau-nan-is-bad", "a NaN metric is never better: it counts as a bad epoch",
       rop(patience=1, factor=0.5), lambda o: S.ReduceLROnPlateau(o, patience=1, factor=0.5), 8,
       metrics=[1.0, 0.9, float("nan"), float("nan"), 0.8, float("nan"), float("nan"), 0.7])
    tc(out, "plateau-min-lr-per-group", "min_lr as a list, one floor per group (torch's own test passes "
       "min_lr=[0.4, 0.5]): the 0.05 group stops at 0.02, the default 0.1 group at 0.004",
       rop(patience=1, factor=0.5, min_lr=[0.02, 0.004]),
       lambda o: S.ReduceLROnPlateau(o, patience=1, factor=0.5, min_lr=[0.02, 0.004]), 24, groups=(0.05,),
       metrics=[1.0] * 24)
    tc(out, "plateau-eps-0", "eps = 0 (optax.contrib.reduce_on_plateau's rule: every reduction applies), min/rel, "
       "patience 2, cooldown 1, min_lr 1e-3: a noisy validation loss that flattens",
       rop(patience=2, cooldown=1, factor=0.5, min_lr=1e-3, eps=0.0),
       lambda o: S.ReduceLROnPlateau(o, patience=2, cooldown=1, factor=0.5, min_lr=1e-3, eps=0.0), 60, metrics=m1)
    tc(out, "plateau-negative-metric-eps-0", "plateau-min-rel-negative-metric with eps = 0: the lr never falls, "
       "on torch and on optax.contrib.reduce_on_plateau alike", rop(patience=2, eps=0.0),
       lambda o: S.ReduceLROnPlateau(o, patience=2, eps=0.0), 25, metrics=negative)


def keras_cases(out: Path, write: Write) -> None:
    steps = list(range(0, 1500, 250))
    for test, kw in (("test_decay", {}), ("test_alpha", {"alpha": 0.1}), ("test_mmul", {"m_mul": 0.9}),
                     ("test_tmul", {"t_mul": 1.0})):
        t_mul, m_mul, alpha = kw.get("t_mul", 2.0), kw.get("m_mul", 1.0), kw.get("alpha", 0.0)
        lr = [keras_restarts(s, 1000, t_mul, m_mul, alpha) for s in steps]
        table = {"name": "cosine_restarts", "t_0": 1000, "t_mult": int(t_mul), "m_mul": m_mul, "eta_min": alpha}
        write(out, f"keras-restarts-{test.replace('_', '-')}", f"{KERAS}.{test}: initial lr 1.0, 1000 first decay "
              f"steps, steps 0..1250 by 250 (the test's float64 reference np_cosine_decay_restarts; alpha is "
              f"relative in Keras, absolute here: eta_min = alpha·1.0)", f"Keras's {test}", table, 1.0, [], "sgd",
              1500, 1, {"lr": lr}, at=steps)
    at = list(range(0, 200, 7))
    lr = [[keras_restarts(s, 5, 3.0, 0.5, 0.01 / b) * b for b in (0.4, 0.1)] for s in at]
    write(out, "keras-restarts-m-mul-groups", "Keras's np_cosine_decay_restarts with t_mul 3, m_mul 0.5 for two "
          "groups (alpha = eta_min / lr per group): each restart's peak above eta_min halves",
          f"{KERAS}.np_cosine_decay_restarts in float64 (tools/_schedule_peer_cases.py)",
          {"name": "cosine_restarts", "t_0": 5, "t_mult": 3, "m_mul": 0.5, "eta_min": 0.01}, 0.1, [0.4], "sgd",
          200, 1, {"lr": lr}, at=at)


def optax_cases(out: Path, write: Write) -> None:
    source = f"{OPTAX} schedules on a float64 count (tools/_schedule_peer_cases.py)"

    def case(name: str, desc: str, table: dict[str, Any], make: Callable[[float], Any], steps: int,
             lr: float = 0.1, groups: tuple[float, ...] = ()) -> None:
        base = [*groups, lr]
        write(out, name, source, desc, table, lr, list(groups), "sgd", steps, 1,
              {"lr": optax_values([make(b) for b in base], steps)})

    case("optax-polynomial-end-value", "polynomial_schedule(b, end_value = 0.2·b, power 2, 10): end_factor 0.2",
         {"name": "polynomial", "total_iters": 10, "power": 2.0, "end_factor": 0.2},
         lambda b: optax.polynomial_schedule(b, 0.2 * b, 2.0, 10), 14, groups=(0.3,))
    case("optax-exponential-end-value", "exponential_decay(b, 1, 0.8, end_value = 0.25·b): a floor",
         {"name": "exponential", "gamma": 0.8, "end_factor": 0.25},
         lambda b: optax.exponential_decay(b, 1, 0.8, end_value=0.25 * b), 12)
    case("optax-exponential-growth-ceiling", "exponential_decay(b, 1, 1.3, end_value = 4·b): growth to a ceiling",
         {"name": "exponential", "gamma": 1.3, "end_factor": 4.0},
         lambda b: optax.exponential_decay(b, 1, 1.3, end_value=4.0 * b), 10, lr=0.01)
    case("optax-staircase-begin-end-value", "exponential_decay(b, 3, 0.5, transition_begin = 4, staircase, end_value "
         "= 0.1·b): b held for 4 updates, then a step decay from its own step 0 to the floor",
         {"name": "sequential", "milestones": [4], "schedulers": [
             {"name": "constant"}, {"name": "step", "step_size": 3, "gamma": 0.5, "end_factor": 0.1}]},
         lambda b: optax.exponential_decay(b, 3, 0.5, transition_begin=4, staircase=True, end_value=0.1 * b), 20)
    case("optax-linear-from-above", "linear_schedule(5·b, b, 4): a warm-up that starts above the peak "
         "(start_factor 5; torch's LinearLR refuses start_factor > 1)",
         {"name": "linear", "start_factor": 5.0, "end_factor": 1.0, "total_iters": 4},
         lambda b: optax.linear_schedule(5.0 * b, b, 4), 7, groups=(0.02,))
    case("optax-warmup-cosine-from-above", "warmup_cosine_decay_schedule(3·b, b, 3, 10, 1e-3): the warm-up comes "
         "down to the peak", {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 10, "start_factor": 3.0,
                              "eta_min": 1e-3},
         lambda b: optax.warmup_cosine_decay_schedule(3.0 * b, b, 3, 10, 1e-3), 13)


def _nanogpt_ratio(t: int) -> float:
    """nanoGPT's train.py get_lr(it) over its learning_rate (warmup_iters 4, lr_decay_iters 12,
    min_lr = lr / 10) as a LambdaLR ratio: the kind of lambda `tabulated` states exactly."""
    import math

    if t < 4:
        return (t + 1) / (4 + 1)
    if t > 12:
        return 0.1
    ratio = (t - 4) / (12 - 4)
    return 0.1 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1 - 0.1)


def tabulated_cases(out: Path, tc: Callable[..., None]) -> None:
    """`tabulated`: LambdaLR with a lambda that reads the table (held at its last entry), and a
    nanoGPT-style lambda sampled into a table, expected from LambdaLR with the lambda itself."""
    table = [0.0, 0.25, 0.5, 1.0, 0.8, 0.6]
    tc(out, "tabulated-two-groups", "LambdaLR(lambda t: table[min(t, 5)]): each group's lr times the table, "
       "the last factor held past it", {"name": "tabulated", "factors": table},
       lambda o: S.LambdaLR(o, lambda t: table[min(t, len(table) - 1)]), 9, groups=(0.03,))
    tc(out, "tabulated-per-epoch", "per epoch of 3 updates: the table steps once per epoch",
       {"name": "tabulated", "unit": "epoch", "factors": [1.0, 0.5, 0.125]},
       lambda o: S.LambdaLR(o, lambda e: [1.0, 0.5, 0.125][min(e, 2)]), 12, upe=3)
    sampled = [_nanogpt_ratio(t) for t in range(14)]
    tc(out, "tabulated-sampled-nanogpt-lambda", "nanoGPT's get_lr (warm-up 4, cosine to lr/10 at 12) sampled for 14 "
       "updates: equal to LambdaLR with the lambda itself over those updates, and after them (it holds min_lr)",
       {"name": "tabulated", "factors": sampled}, lambda o: S.LambdaLR(o, _nanogpt_ratio), 20)
    tc(out, "sequential-linear-tabulated", "SequentialLR([LinearLR(0.1, 1, 3), LambdaLR(table)], [3]): the table "
       "restarts at the milestone", {"name": "sequential", "milestones": [3], "schedulers": [
           {"name": "linear", "start_factor": 0.1, "total_iters": 3}, {"name": "tabulated", "factors": [1.0, 0.7, 0.3]}]},
       lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 3), S.LambdaLR(o, lambda t: [1.0, 0.7, 0.3][min(t, 2)])],
                                [3]), 9)
