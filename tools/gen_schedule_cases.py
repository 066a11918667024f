"""Write schedule conformance cases whose expected values come from the frameworks' own schedulers.

    python tools/gen_schedule_cases.py [OUT_DIR]                     # default: conformance/cases/schedule/generated
    python tools/gen_schedule_cases.py --random N [--seed S] OUT_DIR # N random cases from torch classes

Expected lrs: torch.optim.lr_scheduler classes (ConstantLR, StepLR, MultiStepLR, ExponentialLR,
CosineAnnealingLR, LinearLR, PolynomialLR, OneCycleLR, CosineAnnealingWarmRestarts, SequentialLR;
ChainedScheduler, CyclicLR, ReduceLROnPlateau and LambdaLR for `tabulated` in tools/_schedule_peer_cases.py, with Keras's
CosineDecayRestarts tests and optax's end values)
in float64 on torch.optim.SGD (Adam when OneCycleLR cycles beta1), stepped after optimizer.step()
once per update, or once every updates_per_epoch updates for unit = "epoch"; the cycled momentum is
read from the param groups. warmup_cosine with convention "optax": optax.warmup_cosine_decay_schedule
on a float64 count. inverse_sqrt and wsd exist in neither framework: their values are the formulas
written out in tools/_schedule_refs.py (hand calculation; the shapes of fairseq's inverse_sqrt and transformers'
get_wsd_schedule). Never twinstep's code. Hand-checked seed cases live beside the output folder.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim import lr_scheduler as S

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the references beside this script, however it is loaded
from _schedule_peer_cases import (  # noqa: E402
    chained_cases,
    cyclic_cases,
    keras_cases,
    optax_cases,
    plateau_cases,
    tabulated_cases,
)
from _schedule_refs import (  # noqa: E402
    Make,
    formula_values,
    inverse_sqrt,
    optax_warmup_cosine,
    torch_values,
    wsd,
)

from conformance import tomlio  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "schedule" / "generated"
TORCH = f"torch {torch.__version__.split('+')[0]}"
def optimizer_table(lr: float, groups: list[float], opt: str) -> dict[str, Any]:
    table: dict[str, Any] = {"name": opt, "lr": lr}
    if groups:
        table["groups"] = [{"params": [f"part{i}.*"], "lr": g} for i, g in enumerate(groups)]
    return table


def write(out: Path, name: str, source: str, desc: str, schedule: dict[str, Any], lr: float,
          groups: list[float], opt: str, steps: int, upe: int, expected: dict[str, Any],
          at: list[int] | None = None, metrics: list[float] | None = None) -> None:
    inputs: dict[str, Any] = {"steps": steps}
    if upe != 1:
        inputs["updates_per_epoch"] = upe
    if at is not None:
        inputs["at"] = at
    if metrics is not None:
        inputs["metrics"] = metrics
    case = {"id": f"schedule/{name}", "kind": "schedule", "source": source, "description": desc,
            "optimizer": optimizer_table(lr, groups, opt), "schedule": schedule, "inputs": inputs,
            "expected": expected}
    (out / f"{name}.toml").write_text(tomlio.dumps(case))


def torch_case(out: Path, name: str, desc: str, schedule: dict[str, Any], make: Make, steps: int,
               lr: float = 0.1, groups: tuple[float, ...] = (), upe: int = 1, opt: str = "sgd",
               metrics: list[float] | None = None, at: list[int] | None = None) -> None:
    base = [*groups, lr]
    momentum = schedule.get("name") in ("onecycle", "cyclic") and schedule.get("cycle_momentum", True)
    expected = torch_values(base, make, steps, upe, opt, momentum, metrics, at)
    calls = ("with the metric observed after each update" if metrics is not None else
             "once every updates_per_epoch updates" if upe != 1 else "once per update")
    source = f"{TORCH} torch.optim.lr_scheduler in float64, stepped {calls} (tools/gen_schedule_cases.py)"
    write(out, name, source, desc, schedule, lr, list(groups), opt, steps, upe, expected, at, metrics)


def hand_case(out: Path, name: str, desc: str, schedule: dict[str, Any], fn: Callable[[float, int], float],
              formula: str, steps: int, lr: float = 0.1, groups: tuple[float, ...] = (), upe: int = 1) -> None:
    base = [*groups, lr]
    source = f"hand calculation in float64: {formula} (tools/gen_schedule_cases.py)"
    write(out, name, source, desc, schedule, lr, list(groups), "sgd", steps, upe,
          {"lr": formula_values(base, fn, steps, upe)})


def error_case(out: Path, name: str, desc: str, schedule: dict[str, Any], opt: dict[str, Any], steps: int,
               error: str, message: str) -> None:
    case = {"id": f"schedule/{name}", "kind": "schedule", "source": "twinstep's error contract "
            "(docs/contract.md §3: a case may expect an error class)", "description": desc,
            "optimizer": opt, "schedule": schedule, "inputs": {"steps": steps},
            "expected": {"error": error, "message": message}}
    (out / f"{name}.toml").write_text(tomlio.dumps(case))


def bundled_cases(out: Path) -> None:
    """The bundled suite: at least three cases per schedule, every torch option at least once."""
    tc, hc = torch_case, hand_case
    # constant / ConstantLR
    tc(out, "constant-two-groups", "no options: each group keeps its own lr", {"name": "constant"},
       lambda o: S.ConstantLR(o, factor=1.0, total_iters=1), 5, groups=(0.3,))
    tc(out, "constant-factor", "ConstantLR: lr·0.5 for 3 updates, then lr", {"name": "constant", "factor": 0.5,
       "total_iters": 3}, lambda o: S.ConstantLR(o, 0.5, 3), 6)
    tc(out, "constant-factor-default-iters", "factor alone: torch's total_iters = 5",
       {"name": "constant", "factor": 0.25}, lambda o: S.ConstantLR(o, 0.25), 8, groups=(0.3,))
    tc(out, "constant-factor-per-epoch", "per epoch of 3 updates", {"name": "constant", "unit": "epoch",
       "factor": 0.5, "total_iters": 2}, lambda o: S.ConstantLR(o, 0.5, 2), 10, upe=3)
    # step
    tc(out, "step-default-gamma", "StepLR with torch's gamma = 0.1", {"name": "step", "step_size": 3},
       lambda o: S.StepLR(o, 3), 10)
    tc(out, "step-two-groups", "every group decays from its own lr", {"name": "step", "step_size": 2,
       "gamma": 0.5}, lambda o: S.StepLR(o, 2, 0.5), 9, groups=(0.02,))
    tc(out, "step-size-49-boundaries", "StepLR(49, 0.99) over 5000 updates, on both sides of every boundary "
       "(inputs.at): optax's staircase under a float64 count lands early at some (docs/divergences.md S-STAIRCASE)",
       {"name": "step", "step_size": 49, "gamma": 0.99}, lambda o: S.StepLR(o, 49, 0.99), 5000,
       at=[t for m in range(1, 103) for t in (49 * m - 1, 49 * m)])
    tc(out, "step-per-epoch", "unit = epoch: the decay comes every 2 epochs of 4 updates",
       {"name": "step", "unit": "epoch", "step_size": 2, "gamma": 0.5}, lambda o: S.StepLR(o, 2, 0.5), 20, upe=4)
    # multistep
    tc(out, "multistep-basic", "MultiStepLR: the new lr applies from the milestone update on",
       {"name": "multistep", "milestones": [3, 7]}, lambda o: S.MultiStepLR(o, [3, 7]), 10)
    tc(out, "multistep-groups", "three groups, a milestone at update 1", {"name": "multistep",
       "milestones": [1, 2, 10], "gamma": 0.5}, lambda o: S.MultiStepLR(o, [1, 2, 10], 0.5), 12, groups=(0.3, 1.0))
    tc(out, "multistep-per-epoch", "milestones in epochs of 2 updates", {"name": "multistep", "unit": "epoch",
       "milestones": [2, 3], "gamma": 0.2}, lambda o: S.MultiStepLR(o, [2, 3], 0.2), 10, upe=2)
    # exponential
    tc(out, "exponential-0.9", "ExponentialLR(0.9) for 30 updates (torch multiplies recursively)",
       {"name": "exponential", "gamma": 0.9}, lambda o: S.ExponentialLR(o, 0.9), 30)
    tc(out, "exponential-groups", "two groups", {"name": "exponential", "gamma": 0.5},
       lambda o: S.ExponentialLR(o, 0.5), 12, groups=(1.0,))
    tc(out, "exponential-growth", "gamma > 1 (an lr range test)", {"name": "exponential", "gamma": 1.05},
       lambda o: S.ExponentialLR(o, 1.05), 20, lr=1e-4)
    # cosine
    tc(out, "cosine-past-t-max", "CosineAnnealingLR past t_max climbs back to the base lr at 2·t_max",
       {"name": "cosine", "t_max": 10}, lambda o: S.CosineAnnealingLR(o, 10), 31)
    tc(out, "cosine-eta-min-groups", "eta_min is absolute: both groups end at 1e-3",
       {"name": "cosine", "t_max": 7, "eta_min": 1e-3}, lambda o: S.CosineAnnealingLR(o, 7, 1e-3), 16,
       groups=(0.05,))
    tc(out, "cosine-t-max-1", "t_max = 1 alternates between lr and eta_min", {"name": "cosine", "t_max": 1,
       "eta_min": 0.01}, lambda o: S.CosineAnnealingLR(o, 1, 0.01), 6)
    tc(out, "cosine-per-epoch", "per epoch of 3 updates", {"name": "cosine", "unit": "epoch", "t_max": 4,
       "eta_min": 0.01}, lambda o: S.CosineAnnealingLR(o, 4, 0.01), 15, upe=3)
    tc(out, "cosine-long", "600 updates of t_max = 500: the recursive torch form stays on the closed form",
       {"name": "cosine", "t_max": 500, "eta_min": 1e-5}, lambda o: S.CosineAnnealingLR(o, 500, 1e-5), 600, lr=3e-4)
    # linear
    tc(out, "linear-defaults", "LinearLR defaults: 1/3 -> 1 over 5 updates", {"name": "linear"},
       lambda o: S.LinearLR(o), 8)
    tc(out, "linear-decay-groups", "a linear decay to 0.1·lr", {"name": "linear", "start_factor": 1.0,
       "end_factor": 0.1, "total_iters": 10}, lambda o: S.LinearLR(o, 1.0, 0.1, 10), 14, groups=(0.01,))
    tc(out, "linear-flat", "start_factor = end_factor", {"name": "linear", "start_factor": 0.5,
       "end_factor": 0.5, "total_iters": 4}, lambda o: S.LinearLR(o, 0.5, 0.5, 4), 6)
    # polynomial
    tc(out, "polynomial-defaults", "PolynomialLR defaults: linear to 0 over 5", {"name": "polynomial"},
       lambda o: S.PolynomialLR(o), 8)
    tc(out, "polynomial-power-2-groups", "power 2", {"name": "polynomial", "total_iters": 10, "power": 2.0},
       lambda o: S.PolynomialLR(o, 10, 2.0), 13, groups=(0.5,))
    tc(out, "polynomial-sqrt", "power 0.5", {"name": "polynomial", "total_iters": 6, "power": 0.5},
       lambda o: S.PolynomialLR(o, 6, 0.5), 8)
    tc(out, "polynomial-power-0.9", "power 0.9 (the DeepLab 'poly' schedule) past its end: 0 from update 10 on",
       {"name": "polynomial", "total_iters": 10, "power": 0.9}, lambda o: S.PolynomialLR(o, 10, 0.9), 13)
    # onecycle
    tc(out, "onecycle-defaults-sgd", "OneCycleLR defaults, SGD momentum cycled 0.95 -> 0.85 -> 0.95",
       {"name": "onecycle", "total_steps": 20}, lambda o: S.OneCycleLR(o, [0.1], 20), 20)
    tc(out, "onecycle-three-phase-linear-adam", "three_phase, linear annealing, Adam beta1 cycled",
       {"name": "onecycle", "total_steps": 30, "three_phase": True, "anneal_strategy": "linear"},
       lambda o: S.OneCycleLR(o, [0.1], 30, three_phase=True, anneal_strategy="linear"), 30, opt="adam")
    tc(out, "onecycle-groups-no-momentum", "per-group peaks, pct_start 0.25, div 10, final_div 100",
       {"name": "onecycle", "total_steps": 25, "pct_start": 0.25, "div_factor": 10.0, "final_div_factor": 100.0,
        "cycle_momentum": False}, lambda o: S.OneCycleLR(o, [0.5, 0.1], 25, pct_start=0.25, div_factor=10.0,
       final_div_factor=100.0, cycle_momentum=False), 25, groups=(0.5,))
    tc(out, "onecycle-max-lr-fractional", "max_lr = 0.05 and pct_start·T = 6.29 (fractional phase end)",
       {"name": "onecycle", "total_steps": 17, "max_lr": 0.05, "pct_start": 0.37, "base_momentum": 0.8,
        "max_momentum": 0.9}, lambda o: S.OneCycleLR(o, 0.05, 17, pct_start=0.37, base_momentum=0.8,
       max_momentum=0.9), 17, opt="rmsprop")
    tc(out, "onecycle-per-epoch-adamw", "per epoch of 3 updates", {"name": "onecycle", "unit": "epoch",
       "total_steps": 6}, lambda o: S.OneCycleLR(o, [0.1], 6), 18, upe=3, opt="adamw")
    # cosine_restarts
    tc(out, "restarts-t0-5", "CosineAnnealingWarmRestarts(5): eta_min is never reached", {"name": "cosine_restarts",
       "t_0": 5, "eta_min": 1e-3}, lambda o: S.CosineAnnealingWarmRestarts(o, 5, eta_min=1e-3), 23)
    tc(out, "restarts-t-mult-2", "cycles of 2, 4, 8, 16 updates", {"name": "cosine_restarts", "t_0": 2,
       "t_mult": 2}, lambda o: S.CosineAnnealingWarmRestarts(o, 2, 2), 40)
    tc(out, "restarts-t-mult-3-groups", "cycles of 3, 9, 27; two groups", {"name": "cosine_restarts", "t_0": 3,
       "t_mult": 3, "eta_min": 1e-4}, lambda o: S.CosineAnnealingWarmRestarts(o, 3, 3, 1e-4), 45, groups=(0.01,))
    # warmup_cosine
    torch_wc = [("warmup-cosine-torch", "convention torch: SequentialLR(LinearLR, CosineAnnealingLR); past "
                 "total_steps the cosine climbs back", 5, 20, 0.1, 1e-3, 40, ()),
                ("warmup-cosine-torch-groups", "convention torch, two groups", 4, 10, 0.25, 0.0, 14, (0.02,))]
    for name, desc, w, total, sf, eta, steps, groups in torch_wc:
        tc(out, name, desc, {"name": "warmup_cosine", "warmup_steps": w, "total_steps": total, "start_factor": sf,
           "eta_min": eta, "convention": "torch"},
           lambda o, w=w, t=total, sf=sf, e=eta: S.SequentialLR(o, [S.LinearLR(o, sf, 1.0, w),
                                                                  S.CosineAnnealingLR(o, t - w, e)], [w]),
           steps, groups=groups)
    import optax

    optax_wc = [("warmup-cosine-optax", "optax.warmup_cosine_decay_schedule from 0: update 0 applies 0, "
                 "update 5 the peak, eta_min held from update 20", 5, 20, 0.0, 1e-4, 26, ()),
                ("warmup-cosine-optax-groups", "two groups, init 0.1·peak", 3, 12, 0.1, 0.0, 15, (0.3,)),
                ("warmup-cosine-no-warmup", "warmup_steps = 0: a cosine that holds eta_min", 0, 10, 0.0, 0.01, 12, ())]
    for name, desc, w, total, sf, eta, steps, groups in optax_wc:
        base = [*groups, 0.1]
        write(out, name, f"optax {optax.__version__} optax.warmup_cosine_decay_schedule on a float64 count "
              "(tools/gen_schedule_cases.py)", desc, {"name": "warmup_cosine", "warmup_steps": w,
              "total_steps": total, "start_factor": sf, "eta_min": eta}, 0.1, list(groups), "sgd", steps, 1,
              {"lr": optax_warmup_cosine(base, sf, w, total, eta, steps)})
    # inverse_sqrt (hand)
    isq = "b·(sf + (1 − sf)·s/W) for s < W, else b·sqrt(τ/(s − W + τ))"
    hc(out, "inverse-sqrt-warmup", "linear warm-up from 0 over 4, then sqrt(4/s)",
       {"name": "inverse_sqrt", "warmup_steps": 4}, lambda b, s: inverse_sqrt(b, 0.0, 4, 4, s), isq, 20)
    hc(out, "inverse-sqrt-timescale", "no warm-up, timescale 10", {"name": "inverse_sqrt", "warmup_steps": 0,
       "timescale": 10}, lambda b, s: inverse_sqrt(b, 0.0, 0, 10, s), isq, 20)
    hc(out, "inverse-sqrt-groups", "start_factor 0.25, timescale 12, two groups", {"name": "inverse_sqrt",
       "warmup_steps": 3, "start_factor": 0.25, "timescale": 12},
       lambda b, s: inverse_sqrt(b, 0.25, 3, 12, s), isq, 20, groups=(0.01,))
    # wsd (hand)
    ws = "warm-up, then b, then eta + (b − eta)·shape((s − T + D)/D) over the last D updates, eta from T on"
    for name, desc, w, sf, total, d, kind, eta, steps, groups in [
        ("wsd-linear", "5 warm-up, 15 stable, 10 linear decay to 0, held", 5, 0.0, 30, 10, "linear", 0.0, 35, ()),
        ("wsd-cosine-eta-min", "no warm-up, cosine decay to 1e-3", 0, 0.0, 20, 8, "cosine", 1e-3, 22, ()),
        ("wsd-1-sqrt-groups", "1 − sqrt decay, two groups", 3, 0.1, 25, 10, "1-sqrt", 1e-4, 27, (0.01,)),
        ("wsd-no-stable", "warm-up straight into the decay", 4, 0.0, 12, 8, "linear", 0.0, 14, ()),
    ]:
        hc(out, name, desc, {"name": "wsd", "warmup_steps": w, "start_factor": sf, "total_steps": total,
           "decay_steps": d, "decay_type": kind, "eta_min": eta},
           lambda b, s, a=(sf, w, total, d, kind, eta): wsd(b, a[0], a[1], a[2], a[3], a[4], a[5], s), ws, steps,
           groups=groups)
    # sequential
    def part(name: str, **kw: Any) -> dict[str, Any]:
        return {"name": name, **kw}

    tc(out, "sequential-linear-exponential", "LinearLR for 3 updates, then ExponentialLR from the base lr",
       {"name": "sequential", "milestones": [3], "schedulers": [part("linear", start_factor=0.1, total_iters=3),
        part("exponential", gamma=0.9)]},
       lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 3), S.ExponentialLR(o, 0.9)], [3]), 15)
    tc(out, "sequential-three-parts", "ConstantLR, CosineAnnealingLR, StepLR; two groups",
       {"name": "sequential", "milestones": [2, 9], "schedulers": [part("constant", factor=0.5, total_iters=2),
        part("cosine", t_max=6, eta_min=0.01), part("step", step_size=2, gamma=0.5)]},
       lambda o: S.SequentialLR(o, [S.ConstantLR(o, 0.5, 2), S.CosineAnnealingLR(o, 6, 0.01), S.StepLR(o, 2, 0.5)],
                                [2, 9]), 20, groups=(0.3,))
    tc(out, "sequential-cut-warmup", "milestone 3 cuts LinearLR(0.2, 1, 6) at 0.6·lr: the cosine restarts "
       "at the full lr (SequentialLR's milestone behaviour)", {"name": "sequential", "milestones": [3],
        "schedulers": [part("linear", start_factor=0.2, total_iters=6), part("cosine", t_max=10)]},
       lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.2, 1.0, 6), S.CosineAnnealingLR(o, 10)], [3]), 15)
    tc(out, "sequential-restarts-multistep", "CosineAnnealingWarmRestarts, then MultiStepLR",
       {"name": "sequential", "milestones": [9], "schedulers": [part("cosine_restarts", t_0=3, t_mult=2),
        part("multistep", milestones=[2, 4], gamma=0.5)]},
       lambda o: S.SequentialLR(o, [S.CosineAnnealingWarmRestarts(o, 3, 2), S.MultiStepLR(o, [2, 4], 0.5)], [9]), 16)
    tc(out, "sequential-per-epoch", "per epoch of 2 updates", {"name": "sequential", "unit": "epoch",
       "milestones": [2], "schedulers": [part("linear", start_factor=0.5, total_iters=2),
                                         part("polynomial", total_iters=4, power=2.0)]},
       lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.5, 1.0, 2), S.PolynomialLR(o, 4, 2.0)], [2]), 14, upe=2)
    tc(out, "sequential-with-warmup-cosine", "a warmup_cosine part (torch: its LinearLR and CosineAnnealingLR "
       "flattened into one SequentialLR), cut by the next milestone, then ExponentialLR",
       {"name": "sequential", "milestones": [8], "schedulers": [part("warmup_cosine", warmup_steps=3,
        total_steps=10, start_factor=0.5, convention="torch"), part("exponential", gamma=0.8)]},
       lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.5, 1.0, 3), S.CosineAnnealingLR(o, 7), S.ExponentialLR(o, 0.8)],
                                [3, 8]), 14, groups=(0.02,))
    tc(out, "sequential-single-part", "one part, no milestones", {"name": "sequential", "schedulers":
       [part("exponential", gamma=0.8)]}, lambda o: S.SequentialLR(o, [S.ExponentialLR(o, 0.8)], []), 6)
    # the peers' own schedulers: ChainedScheduler, CyclicLR, ReduceLROnPlateau, Keras's m_mul tests, optax's end values
    chained_cases(out, tc)
    tabulated_cases(out, tc)
    cyclic_cases(out, tc)
    plateau_cases(out, tc)
    keras_cases(out, write)
    optax_cases(out, write)
    # errors raised at run time (both backends, same class)
    sgd = {"name": "sgd", "lr": 0.1}
    error_case(out, "error-onecycle-shorter-than-run", "torch's OneCycleLR raises past total_steps",
               {"name": "onecycle", "total_steps": 10}, sgd, 12, "ConfigError", "shorter than the run")
    error_case(out, "error-cycle-momentum-adagrad", "Adagrad has neither momentum nor betas to cycle",
               {"name": "onecycle", "total_steps": 10}, {"name": "adagrad", "lr": 0.1}, 5, "ConfigError",
               "cycle_momentum")
    error_case(out, "error-eta-min-above-group-lr", "a group whose lr is below eta_min",
               {"name": "warmup_cosine", "warmup_steps": 2, "total_steps": 10, "eta_min": 0.05},
               {**sgd, "groups": [{"params": ["head.*"], "lr": 0.01}]}, 5, "ConfigError", "eta_min")
    error_case(out, "error-max-lr-with-group-lr", "max_lr would override the group's own lr",
               {"name": "onecycle", "total_steps": 10, "max_lr": 0.2},
               {**sgd, "groups": [{"params": ["head.*"], "lr": 0.01}]}, 5, "ConfigError", "max_lr")
    error_case(out, "error-cyclic-base-lr-with-group-lr", "base_lr would override the group's own lr",
               {"name": "cyclic", "max_lr": 0.2, "base_lr": 0.01},
               {**sgd, "groups": [{"params": ["head.*"], "lr": 0.01}]}, 5, "ConfigError", "base_lr")
    error_case(out, "error-cyclic-momentum-adagrad", "torch's CyclicLR refuses an optimizer without momentum or "
               "betas when cycle_momentum = true (its default)", {"name": "cyclic", "max_lr": 0.2},
               {"name": "adagrad", "lr": 0.1}, 5, "ConfigError", "cycle_momentum")
    error_case(out, "error-chained-cosine-past-t-max", "a chained cosine stops being a factor past t_max",
               {"name": "chained", "schedulers": [{"name": "cosine", "t_max": 4}]}, sgd, 7, "ConfigError",
               "past t_max")


def _random_part(r: np.random.Generator, base: list[float], length: int, top: bool) -> tuple[dict, Make]:
    """A random torch scheduler (table, constructor) with options drawn across their ranges."""
    def u(lo: float, hi: float, digits: int = 4) -> float:
        return float(round(r.uniform(lo, hi), digits))

    def n(lo: int, hi: int) -> int:
        return int(r.integers(lo, hi + 1))

    # a sequential part cannot itself be a SequentialLR in torch (it fails at the milestone)
    kinds = ["constant", "step", "multistep", "exponential", "cosine", "linear", "polynomial", "restarts"]
    kinds += ["warmup_cosine", "onecycle", "onecycle"] if top else []
    kind = kinds[int(r.integers(len(kinds)))]
    if kind == "constant":
        f, k = u(0.05, 1.0), n(1, 20)
        return {"name": "constant", "factor": f, "total_iters": k}, lambda o: S.ConstantLR(o, f, k)
    if kind == "step":
        k, g = n(1, 30), u(0.1, 0.99)
        return {"name": "step", "step_size": k, "gamma": g}, lambda o: S.StepLR(o, k, g)
    if kind == "multistep":
        ms = sorted({n(1, max(2, length)) for _ in range(n(1, 4))})
        g = u(0.1, 0.9)
        return {"name": "multistep", "milestones": ms, "gamma": g}, lambda o: S.MultiStepLR(o, ms, g)
    if kind == "exponential":
        g = u(0.9, 1.0, 5)
        return {"name": "exponential", "gamma": g}, lambda o: S.ExponentialLR(o, g)
    if kind == "cosine":
        t, e = n(1, max(1, length)), u(0.0, min(base) * 0.5, 6)
        return {"name": "cosine", "t_max": t, "eta_min": e}, lambda o: S.CosineAnnealingLR(o, t, e)
    if kind == "linear":
        a, b, k = u(0.01, 1.0), u(0.0, 1.0), n(1, 50)
        return ({"name": "linear", "start_factor": a, "end_factor": b, "total_iters": k},
                lambda o: S.LinearLR(o, a, b, k))
    if kind == "polynomial":
        k, p = n(1, 60), u(0.0, 3.0, 2)
        return {"name": "polynomial", "total_iters": k, "power": p}, lambda o: S.PolynomialLR(o, k, p)
    if kind == "restarts":
        t0, m, e = n(1, 12), n(1, 3), u(0.0, min(base) * 0.5, 6)
        return ({"name": "cosine_restarts", "t_0": t0, "t_mult": m, "eta_min": e},
                lambda o: S.CosineAnnealingWarmRestarts(o, t0, m, e))
    if kind == "warmup_cosine":
        w = n(1, 20)
        total, sf, e = w + n(1, max(1, length)), u(0.01, 1.0), u(0.0, min(base) * 0.5, 6)
        return ({"name": "warmup_cosine", "warmup_steps": w, "total_steps": total, "start_factor": sf,
                 "eta_min": e, "convention": "torch"},
                lambda o: S.SequentialLR(o, [S.LinearLR(o, sf, 1.0, w), S.CosineAnnealingLR(o, total - w, e)], [w]))
    total = max(length, 4)
    three = bool(r.integers(2))
    hi = min(0.95, (total + 1) / (2 * total) - 1e-3) if three else 0.95
    pct = u(1.0 / total + 1e-3, hi)
    kw = dict(pct_start=pct, anneal_strategy=str(r.choice(["cos", "linear"])), three_phase=three,
              div_factor=u(2.0, 50.0, 2), final_div_factor=u(10.0, 1e4, 1), cycle_momentum=bool(r.integers(2)),
              base_momentum=u(0.7, 0.85), max_momentum=u(0.86, 0.99))
    return {"name": "onecycle", "total_steps": total, **kw}, lambda o: S.OneCycleLR(o, list(base), total, **kw)


def random_cases(out: Path, count: int, seed: int) -> None:
    """`count` random cases: random groups, options, unit and sequential compositions, torch's values."""
    r = np.random.default_rng(seed)
    for i in range(count):
        groups = tuple(float(round(r.uniform(1e-3, 1.0), 4)) for _ in range(int(r.integers(0, 3))))
        lr = float(round(r.uniform(1e-3, 1.0), 4))
        base = [*groups, lr]
        upe = int(r.integers(2, 6)) if r.random() < 0.25 else 1
        steps = int(r.integers(10, 300))
        length = (steps - 1) // upe + 1
        opt = str(r.choice(["sgd", "adam"]))
        if r.random() < 0.25:
            k = int(r.integers(2, 4))
            cuts = sorted(int(c) for c in r.choice(np.arange(1, max(length, k + 1)), k - 1, replace=False))
            parts = [_random_part(r, base, length, False) for _ in range(k)]
            schedule: dict[str, Any] = {"name": "sequential", "milestones": cuts, "schedulers": [p[0] for p in parts]}
            make: Make = lambda o, ps=parts, cs=cuts: S.SequentialLR(o, [p[1](o) for p in ps], cs)  # noqa: E731
        else:
            schedule, make = _random_part(r, base, length, True)
        if upe != 1:
            schedule = {**schedule, "unit": "epoch"}
        torch_case(out, f"random-{seed}-{i:04d}-{schedule['name']}", f"random case {i} (seed {seed})",
                   schedule, make, steps, lr=lr, groups=groups, upe=upe, opt=opt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=OUT)
    parser.add_argument("--random", type=int, metavar="N", help="write N random cases from torch classes")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.random:
        random_cases(args.out, args.random, args.seed)
    else:
        bundled_cases(args.out)


if __name__ == "__main__":
    main()
