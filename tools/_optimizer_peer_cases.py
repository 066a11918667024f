"""The peer-checked optimizer cases for tools/gen_optimizer_cases.py: decoupled decay on every
optimizer, eps_hat, Keras's semantics (computed by Keras, and quoted from Keras's own tests),
schedule-free (from the schedulefree package) and the weights' EMA (torch.optim.swa_utils's
AveragedModel with get_ema_multi_avg_fn, and Keras's use_ema)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from _keras_refs import GOLDENS, golden_inputs


def wave2(add: Any) -> None:
    """Decoupled decay on every optimizer, eps_hat, Keras's semantics, schedule-free."""
    dec = {"decoupled_weight_decay": True}
    add("torch-sgd-decoupled", {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.1, **dec}, "open",
        note="SGD, p·(1 − lr·wd) before each step (AdamW's order); w has no gradient in update 1")
    add("torch-rmsprop-decoupled", {"name": "rmsprop", "lr": 0.05, "centered": True, "momentum": 0.5,
                                    "weight_decay": 0.2, **dec}, "objective", n=5)
    add("torch-adagrad-decoupled", {"name": "adagrad", "lr": 0.3, "lr_decay": 0.1, "weight_decay": 0.1, **dec},
        "open", note="the decay uses the group's lr, not lr_decay's rate")
    add("torch-adamax-decoupled", {"name": "adamax", "lr": 0.05, "weight_decay": 0.2, **dec,
                                   "groups": [{"params": ["head.*"], "weight_decay": 0.0}]}, "groups")
    add("torch-adam-eps-hat", {"name": "adam", "lr": 0.1, "eps": 0.1, "eps_hat": True, "weight_decay": 0.1},
        "objective", n=6, note="eps_hat as torch.optim.Adam with eps/sqrt(1 - beta2^t) at update t")
    add("torch-adamw-eps-hat-amsgrad", {"name": "adamw", "lr": 0.05, "eps": 0.5, "eps_hat": True, "amsgrad": True},
        "groups", note="eps_hat with torch's AMSGrad (Keras's amsgrad: the max of the raw v)")
    add("torch-nadam-eps-hat", {"name": "nadam", "lr": 0.05, "eps": 0.3, "eps_hat": True, "momentum_decay": 0.05},
        "objective", n=6, note="NAdam's Dozat schedule with eps on the raw sqrt(v) (eps/sqrt(1 - beta2^t))")
    keras = {"reference": "keras"}
    add("keras-adam-eps-hat", {"name": "adam", "lr": 0.1, "eps": 0.5, "eps_hat": True, "weight_decay": 0.05, **dec},
        "open", **keras, note="keras.optimizers.Adam(epsilon=0.5, weight_decay=0.05)")
    add("keras-adamw-eps-hat", {"name": "adamw", "lr": 0.02, "eps": 1e-3, "eps_hat": True, "weight_decay": 0.1},
        "objective", n=6, **keras)
    add("keras-adamax-eps-hat", {"name": "adamax", "lr": 0.1, "betas": [0.8, 0.95], "eps": 0.3, "eps_hat": True},
        "objective", n=5, **keras, note="eps outside the max")
    add("keras-sgd-weight-decay", {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1,
                                   **dec}, "open", **keras)
    add("keras-rmsprop-weight-decay", {"name": "rmsprop", "lr": 0.01, "alpha": 0.9, "eps": 1e-7, "eps_in_sqrt": True,
                                       "weight_decay": 0.2, **dec}, "open", n=5, **keras)
    add("keras-rmsprop-momentum", {"name": "rmsprop", "lr": 0.02, "alpha": 0.9, "eps": 1e-4, "eps_in_sqrt": True,
                                   "centered": True, "momentum": 0.5, "weight_decay": 0.05, **dec}, "objective", n=5,
        **keras, note="Keras's momentum buffer holds lr·g/s: equal for a constant lr")
    add("keras-adagrad-weight-decay", {"name": "adagrad", "lr": 0.1, "initial_accumulator_value": 0.1, "eps": 1e-7,
                                       "eps_in_sqrt": True, "weight_decay": 0.1, **dec}, "open", n=5, **keras)
    add("keras-adamax-weight-decay", {"name": "adamax", "lr": 0.05, "eps": 1e-7, "eps_hat": True, "weight_decay": 0.2,
                                      **dec}, "open", n=5, **keras)
    add("keras-nadam", {"name": "nadam", "lr": 0.05, "eps": 1e-7, "momentum_decay": 1.0, "weight_decay": 0.1, **dec},
        "objective", n=6, **keras, note="Keras's Nadam is torch's NAdam with momentum_decay = 1 (0.96^t)")
    sf = {"reference": "schedulefree"}
    add("schedulefree-adamw-open", {"name": "schedule_free_adamw", "lr": 0.05, "warmup_steps": 3, "weight_decay": 0.1},
        "open", n=6, **sf, note="AdamWScheduleFree with a 3-update warm-up and decay at y")
    add("schedulefree-adamw-closed", {"name": "schedule_free_adamw", "lr": 0.1, "betas": [0.8, 0.99], "r": 0.5,
                                      "weight_lr_power": 1.0}, "objective", n=8, **sf)
    add("schedulefree-adamw-groups", {"name": "schedule_free_adamw", "lr": 0.02, "warmup_steps": 2,
                                      "groups": [{"params": ["head.*"], "lr": 0.005, "betas": [0.5, 0.9]}]},
        "groups", n=5, **sf)
    add("schedulefree-sgd-open", {"name": "schedule_free_sgd", "lr": 0.5, "warmup_steps": 2, "weight_decay": 0.05},
        "open", n=6, **sf, note="SGDScheduleFree with a 2-update warm-up")
    add("schedulefree-sgd-closed", {"name": "schedule_free_sgd", "lr": 0.2, "momentum": 0.5, "r": 1.0,
                                    "weight_lr_power": 0.0}, "objective", n=8, **sf)
    add("schedulefree-sgd-groups", {"name": "schedule_free_sgd", "lr": 0.3,
                                    "groups": [{"params": ["enc.*"], "momentum": 0.7, "weight_decay": 0.1}]},
        "groups", n=5, **sf)
    ema_cases(add)


def keras_quoted() -> list[dict[str, Any]]:
    """Cases quoted from Keras's own tests: the goldens and test_weight_decay."""
    out = []
    params, grads = golden_inputs()
    for name, (spec, rows) in GOLDENS.items():
        out.append({"case_id": f"optimizer/keras-{name}-golden", "spec": spec, "params": params, "grads": grads,
                    "quoted": [{"x": np.asarray(r)} for r in rows], "tolerance": {"atol": 5e-4, "rtol": 5e-4},
                    "source": f"keras/src/optimizers/{name}_test.py::test_correctness_with_golden (keras 3.15.1): "
                              f"4 decimals, checked at rtol = atol = 5e-4 as Keras does"})
    zeros = [{"var1": np.zeros(1), "exclude": np.zeros(1)}] * 3
    decay = [{"var1": np.asarray([2.0 * 0.996 ** k]), "exclude": np.asarray([2.0])} for k in (1, 2, 3)]
    for name, extra in (("sgd", {}), ("rmsprop", {"eps_in_sqrt": True}), ("adagrad", {"eps_in_sqrt": True}),
                        ("adamax", {"eps_hat": True})):
        spec = {"name": name, "lr": 1.0, "weight_decay": 0.004, "decoupled_weight_decay": True,
                "no_weight_decay": ["exclude"], **extra}
        out.append({"case_id": f"optimizer/keras-{name}-weight-decay-test", "spec": spec, "grads": zeros,
                    "params": {"var1": np.asarray([2.0]), "exclude": np.asarray([2.0])}, "quoted": decay,
                    "tolerance": {"atol": 5e-7, "rtol": 0.0},
                    "source": f"keras/src/optimizers/{name}_test.py::test_weight_decay (keras 3.15.1): var1 = 2.0 "
                              f"with zero gradients, lr 1, weight_decay 0.004, three updates -> 1.9760959 "
                              f"(decimal=6); the excluded variable stays 2.0; updates 0 and 1 by hand "
                              f"(2·0.996, 2·0.996²)"})
    return out


def torch_ema(ema: dict[str, Any], params: dict[str, Any], trajectory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The EMA of a parameter trajectory by torch.optim.swa_utils.AveragedModel(multi_avg_fn=
    get_ema_multi_avg_fn(decay)), update_parameters(model) after each due update (t ≥ start and
    (t − start) % every == 0); {} while it has not started."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    module = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(np.asarray(v, np.float64)))
                                     for k, v in params.items()})
    averaged = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(ema["decay"]))
    every, start = ema.get("every", 1), ema.get("start", 0)
    out = []
    with torch.no_grad():
        for t, values in enumerate(trajectory):
            for k, p in module.items():
                p.copy_(torch.tensor(np.asarray(values[k], np.float64)))
            if t >= start and (t - start) % every == 0:
                averaged.update_parameters(module)
            started = int(averaged.n_averaged) > 0
            out.append({k: p.detach().numpy().copy() for k, p in averaged.module.items()} if started else {})
    return out


def ema_cases(add: Any) -> None:
    """The weights' EMA: torch's AveragedModel with the EMA average, and Keras's use_ema."""
    add("ema-torch-sgd", {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "open", n=5, ema={"decay": 0.9},
        note="[ema] decay 0.9 as torch.optim.swa_utils.AveragedModel(get_ema_multi_avg_fn(0.9)) after each step")
    add("ema-torch-adamw-every-start", {"name": "adamw", "lr": 0.05, "weight_decay": 0.1}, "objective", n=7,
        ema={"decay": 0.5, "every": 2, "start": 1},
        note="AveragedModel.update_parameters after updates 1, 3, 5 (every 2 from 1): the first copies")
    add("ema-keras-adam", {"name": "adam", "lr": 0.05, "eps": 1e-7, "eps_hat": True}, "open", n=5,
        reference="keras", ema={"decay": 0.8}, note="keras.optimizers.Adam(use_ema=True, ema_momentum=0.8)")
