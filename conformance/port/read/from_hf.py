"""`from_hf`: Hugging Face `TrainingArguments` as twinstep's spec sections, read as HF's Trainer uses them.

    spec = from_hf("training_args.json", model=model)          # TrainingArguments.to_json_string()'s JSON,
    spec = from_hf(training_args, model=model, num_training_steps=1200)  # a dict, or the live object

Read (transformers 5.x): `optim` (adamw_torch, adamw_torch_fused -> adamw with adam_beta1/2 and
adam_epsilon; sgd, adagrad, rmsprop -> torch's classes with their defaults, as Trainer builds them),
`learning_rate`, `weight_decay` with HF's no-decay rule (Trainer.get_decay_parameter_names: every
parameter inside a LayerNorm and every name matching bias / layernorm / rmsnorm / norm, which needs
`model` when weight_decay > 0; the names it keeps undecayed become `no_weight_decay` patterns),
`lr_scheduler_type` with `lr_scheduler_kwargs` (through the same mapping as transformers' LambdaLRs:
conformance/port/read/hf_sched.py), `warmup_steps` (a count, or below 1 a fraction of the run,
rounded up as TrainingArguments.get_warmup_steps does), `max_steps` (or `num_training_steps` when it
is -1: epochs × updates per epoch), `max_grad_norm` (torch's clip_grad_norm_; 0 = none),
`gradient_accumulation_steps` (HF divides the summed loss by the window's token count,
`num_items_in_batch`, for models that take it: `normalize = "tokens"`; `num_items_in_batch = False`
for a model that averages each micro-batch itself: "micro_batches"), `fp16` (float16 autocast with
GradScaler's defaults) / `bf16`, `seed` and `per_device_train_batch_size`. Anything else that changes
the mathematics (another optim, optim_args, a scheduler with no spec schedule) is refused naming it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.errors import ConfigError, UnsupportedError
from conformance.port.read.from_torch import validated
from conformance.port.read.hf_sched import read_lambda
from conformance.port.read.patterns import cover

# Trainer.get_decay_parameter_names (transformers 5.x): searched in the lower-cased dotted name
NO_DECAY_NAMES = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "sgd": "sgd", "adagrad": "adagrad",
              "rmsprop": "rmsprop"}


def _load(args: Any) -> dict[str, Any]:
    if isinstance(args, (str, Path)):
        try:
            data = json.loads(Path(args).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{args}: not a TrainingArguments JSON file ({exc})") from None
    elif isinstance(args, Mapping):
        data = dict(args)
    elif hasattr(args, "to_dict"):
        data = args.to_dict()
    else:
        raise ConfigError(f"from_hf reads TrainingArguments, its to_dict() or its JSON; received {type(args).__name__}")
    if not isinstance(data, dict) or "learning_rate" not in data:
        raise ConfigError("the TrainingArguments have no learning_rate: not a TrainingArguments JSON")
    return data


def no_decay_names(model: Any) -> list[str]:
    """The parameter names HF's Trainer leaves undecayed (inside a LayerNorm, or a name its patterns match)."""
    import torch

    patterns = [re.compile(p) for p in NO_DECAY_NAMES]
    inside = {f"{m}.{n}" if m else n for m, module in model.named_modules() if isinstance(module, torch.nn.LayerNorm)
              for n, _ in module.named_parameters(recurse=False)}
    return [n for n, _ in model.named_parameters() if n in inside or any(p.search(n.lower()) for p in patterns)]


def _optimizer(a: dict[str, Any], model: Any, no_decay: list[str] | None) -> dict[str, Any]:
    optim = str(a.get("optim", "adamw_torch"))
    if optim not in OPTIMIZERS:
        raise UnsupportedError(f"optim = {optim!r}: twinstep reads {', '.join(OPTIMIZERS)} (the torch.optim classes "
                               f"Trainer builds); {optim} is another implementation")
    if a.get("optim_args"):
        raise UnsupportedError(f"optim_args = {a['optim_args']!r} has no reading; set the optimizer's fields in the spec")
    out: dict[str, Any] = {"name": OPTIMIZERS[optim], "lr": float(a["learning_rate"]),
                           "weight_decay": float(a.get("weight_decay", 0.0))}
    if out["name"] == "adamw":
        out.update(betas=[float(a.get("adam_beta1", 0.9)), float(a.get("adam_beta2", 0.999))],
                   eps=float(a.get("adam_epsilon", 1e-8)))
    # sgd, adagrad, rmsprop: torch's defaults; Trainer passes the decay to the class (L2 in the gradient)
    if out["weight_decay"] > 0 and no_decay is not None:
        if no_decay:
            out["no_weight_decay"] = list(no_decay)
    elif out["weight_decay"] > 0:
        if model is None:
            raise ConfigError("weight_decay > 0: HF leaves LayerNorm and bias parameters undecayed by module type; "
                              "pass model= (the module Trainer trains) to read which, or name them (no_decay= globs; "
                              "twinstep port --no-decay GLOB)")
        names = [n for n, _ in model.named_parameters()]
        undecayed = no_decay_names(model)
        if undecayed:
            out["no_weight_decay"] = cover(undecayed, names)
    return out


def _schedule(a: dict[str, Any], steps: int, warmup: int, lr: float) -> dict[str, Any]:
    kind, kw = str(a.get("lr_scheduler_type", "linear")), dict(a.get("lr_scheduler_kwargs") or {})
    both = {"num_warmup_steps": warmup, "num_training_steps": steps}
    if kind == "linear":
        return read_lambda("_get_linear_schedule_with_warmup_lr_lambda", both, [lr])
    if kind == "cosine":
        return read_lambda("_get_cosine_schedule_with_warmup_lr_lambda",
                           {**both, "num_cycles": kw.get("num_cycles", 0.5)}, [lr])
    if kind == "cosine_with_min_lr":
        rate = kw.get("min_lr_rate", kw["min_lr"] / lr if kw.get("min_lr") is not None else None)
        if rate is None:
            raise ConfigError("lr_scheduler_type = 'cosine_with_min_lr' needs min_lr or min_lr_rate in lr_scheduler_kwargs")
        return read_lambda("_get_cosine_schedule_with_warmup_lr_lambda",
                           {**both, "num_cycles": kw.get("num_cycles", 0.5), "min_lr_rate": rate}, [lr])
    if kind == "cosine_with_restarts":  # the run ends at num_training_steps, where transformers' lr drops to 0
        return read_lambda("_get_cosine_with_hard_restarts_schedule_with_warmup_lr_lambda",
                           {**both, "num_cycles": kw.get("num_cycles", 1)}, [lr], ends_at_total=True)
    if kind == "constant":
        return read_lambda("_get_constant_lambda", {}, [lr])
    if kind == "constant_with_warmup":
        return read_lambda("_get_constant_schedule_with_warmup_lr_lambda", {"num_warmup_steps": warmup}, [lr])
    if kind == "polynomial":  # transformers' defaults: lr_end 1e-7, power 1
        return read_lambda("_get_polynomial_decay_schedule_with_warmup_lr_lambda",
                           {**both, "lr_end": kw.get("lr_end", 1e-7), "power": kw.get("power", 1.0), "lr_init": lr},
                           [lr])
    if kind == "inverse_sqrt":
        return read_lambda("_get_inverse_sqrt_schedule_lr_lambda",
                           {"num_warmup_steps": warmup, "timescale": kw.get("timescale") or (warmup or 10_000)}, [lr])
    if kind == "warmup_stable_decay":
        decay = kw.get("num_decay_steps")
        if decay is None:
            raise ConfigError("lr_scheduler_type = 'warmup_stable_decay' needs num_decay_steps in lr_scheduler_kwargs")
        stable = kw.get("num_stable_steps", steps - warmup - decay)
        return read_lambda("_get_wsd_scheduler_lambda", {
            "num_warmup_steps": warmup, "num_stable_steps": stable, "num_decay_steps": decay,
            "warmup_type": kw.get("warmup_type", "linear"), "decay_type": kw.get("decay_type", "cosine"),
            "min_lr_ratio": kw.get("min_lr_ratio", 0.0), "num_cycles": kw.get("num_cycles", 0.5)}, [lr])
    raise UnsupportedError(f"lr_scheduler_type = {kind!r} cannot be translated: twinstep reads linear, cosine, "
                           f"cosine_with_min_lr, cosine_with_restarts, constant, constant_with_warmup, polynomial, "
                           f"inverse_sqrt and warmup_stable_decay")


def from_hf(args: Any, *, num_training_steps: int | None = None, model: Any = None,
            num_items_in_batch: bool = True, no_decay: list[str] | None = None) -> dict[str, Any]:
    """The spec sections of Hugging Face TrainingArguments (see the module docstring), validated.
    `no_decay`: glob patterns of the parameters HF leaves undecayed, instead of reading them off `model`."""
    a = _load(args)
    steps = int(a.get("max_steps", -1))
    if steps <= 0:
        if num_training_steps is None:
            raise ConfigError("max_steps = -1: the run's length is epochs × updates per epoch; pass "
                              "num_training_steps (twinstep port --training-steps N)")
        steps = int(num_training_steps)
    w = float(a.get("warmup_steps", 0) or 0)
    warmup = int(w) if w >= 1 else math.ceil(steps * w)  # TrainingArguments.get_warmup_steps
    out: dict[str, Any] = {"optimizer": _optimizer(a, model, no_decay)}
    out["schedule"] = _schedule(a, steps, warmup, out["optimizer"]["lr"])
    if float(a.get("max_grad_norm") or 0) > 0:
        out["clip"] = {"max_norm": float(a["max_grad_norm"])}
    k = int(a.get("gradient_accumulation_steps", 1))
    if k > 1:
        out["accumulation"] = {"steps": k, "normalize": "tokens" if num_items_in_batch else "micro_batches"}
    if a.get("fp16") and a.get("bf16"):
        raise ConfigError("fp16 and bf16 are both set")
    if a.get("fp16"):
        out["precision"] = {"dtype": "float16", "loss_scale": "dynamic"}  # GradScaler's defaults, as accelerate's
    elif a.get("bf16"):
        out["precision"] = {"dtype": "bfloat16"}
    out["run"] = {"seed": int(a.get("seed", 42)), "max_updates": steps}
    if a.get("per_device_train_batch_size"):
        out["data"] = {"batch_size": int(a["per_device_train_batch_size"])}
    return validated(out, "the TrainingArguments")
