"""A spec as Hugging Face `TrainingArguments` keyword arguments (`twinstep port CONFIG --to hf`).

    kwargs = hf_arguments(config)            # TrainingArguments(output_dir=..., **kwargs)

The inverse of conformance/port/read/from_hf.py for what HF's Trainer can state: adamw / sgd /
adagrad / rmsprop with the fields Trainer passes (the others at torch's defaults), the schedules HF
names (linear, cosine, cosine_with_min_lr, constant, inverse_sqrt, warmup_stable_decay, each with a
warm-up from 0 except wsd's from min_lr_ratio), clipping by the 2-norm with torch's eps,
accumulation, float16 with GradScaler's defaults or bfloat16, the seed, the run length and the batch
size. HF decides which parameters are not decayed by its own rule (inside a LayerNorm, or a name
with bias / norm); a spec's `no_weight_decay` is not written and `notes` says so. Anything else is
refused naming the field.
"""

from __future__ import annotations

from typing import Any

from conformance.config import Config, load_config
from conformance.errors import UnsupportedError

HF_OPTIMIZERS = {"adamw": "adamw_torch", "sgd": "sgd", "adagrad": "adagrad", "rmsprop": "rmsprop"}


def _refuse(field: str, value: Any, why: str) -> UnsupportedError:
    return UnsupportedError(f"{field} = {value!r} has no TrainingArguments form: {why}")


def _optimizer(config: Config, out: dict[str, Any], notes: list[str]) -> None:
    o = config.optimizer
    if o.name not in HF_OPTIMIZERS:
        raise _refuse("optimizer.name", o.name, f"Trainer builds {', '.join(HF_OPTIMIZERS)} from torch.optim")
    if o.groups:
        raise _refuse("optimizer.groups", "[...]", "Trainer builds its own two groups (decayed or not)")
    plain = load_config({"optimizer": {"name": o.name}}).optimizer
    passed = {"lr", "weight_decay", "no_weight_decay"} | ({"betas", "eps"} if o.name == "adamw" else set())
    for field, value in o.overrides().items():
        if field not in passed and value != getattr(plain, field):
            raise _refuse(f"optimizer.{field}", value, "Trainer leaves it at torch's default")
    out.update(optim=HF_OPTIMIZERS[o.name], learning_rate=o.lr, weight_decay=o.weight_decay)
    if o.name == "adamw":
        out.update(adam_beta1=o.betas[0], adam_beta2=o.betas[1], adam_epsilon=o.eps)
    if o.weight_decay and o.no_weight_decay:
        notes.append(f"optimizer.no_weight_decay = {o.no_weight_decay} is not written: HF leaves a parameter "
                     f"undecayed when it is inside a LayerNorm or its name has bias / layernorm / rmsnorm / norm")


def _schedule(config: Config, out: dict[str, Any]) -> None:
    s, lr, steps = config.schedule, config.optimizer.lr, out["max_steps"]
    if s.hyper:
        raise _refuse("schedule.hyper", list(s.hyper), "Trainer's lr_scheduler_type schedules the lr only")
    kw: dict[str, Any] = {}
    if s.name == "constant" and s.factor is None:
        kind = "constant"
    elif s.name == "warmup_cosine" and s.convention == "torch" and s.start_factor == 0:
        kind, out["warmup_steps"] = ("cosine_with_min_lr" if s.eta_min else "cosine"), s.warmup_steps
        if s.total_steps - s.warmup_steps != steps - s.warmup_steps:  # HF's period is the run's
            kw["num_cycles"] = (steps - s.warmup_steps) / (2 * (s.total_steps - s.warmup_steps))
        if s.eta_min:
            kw["min_lr_rate"] = s.eta_min / lr
    elif s.name == "inverse_sqrt" and s.start_factor == 0:
        kind, out["warmup_steps"], kw["timescale"] = "inverse_sqrt", s.warmup_steps, s.timescale
    elif s.name == "wsd" and s.start_factor * lr == s.eta_min:
        out["warmup_steps"] = s.warmup_steps
        if s.decay_type == "linear" and s.eta_min == 0 and s.warmup_steps + s.decay_steps == s.total_steps == steps:
            kind = "linear"
        else:
            kind = "warmup_stable_decay"
            kw.update(num_decay_steps=s.decay_steps, num_stable_steps=s.total_steps - s.warmup_steps - s.decay_steps,
                      decay_type=s.decay_type, min_lr_ratio=s.start_factor)
    else:
        raise _refuse("schedule.name", s.name, "HF's schedules are linear, cosine (with a min lr), constant, "
                      "inverse_sqrt and warmup_stable_decay, their warm-ups from 0 (wsd's from min_lr_ratio)")
    out["lr_scheduler_type"] = kind
    if kw:
        out["lr_scheduler_kwargs"] = kw


def hf_arguments(config: Config) -> tuple[dict[str, Any], list[str]]:
    """(TrainingArguments keyword arguments, notes on what HF decides itself) of `config`."""
    if config.run.max_updates is None:
        raise _refuse("run.max_updates", None, "TrainingArguments' max_steps: state the run's length in updates")
    out: dict[str, Any] = {"max_steps": config.run.max_updates, "seed": config.run.seed,
                           "per_device_train_batch_size": config.data.batch_size}
    notes: list[str] = []
    _optimizer(config, out, notes)
    _schedule(config, out)
    c = config.clip
    if c.clip_value is not None or c.per_parameter or c.target != "gradients" or \
            (c.max_norm is not None and (c.norm_type != 2.0 or c.eps != 1e-6)):
        raise _refuse("clip", c.model_dump(exclude_none=True),
                      "Trainer clips by the global 2-norm with torch's eps (max_grad_norm), the gradients")
    out["max_grad_norm"] = c.max_norm or 0.0
    if config.accumulation.steps > 1:
        out["gradient_accumulation_steps"] = config.accumulation.steps
        notes.append(f"accumulation.normalize = {config.accumulation.normalize!r}: HF divides by the window's tokens "
                     f"(num_items_in_batch) when the model's forward takes it, else averages each micro-batch")
    p = config.precision
    if p.dtype == "float16":
        if not p.dynamic_scaling or (p.init_scale, p.growth_factor, p.backoff_factor, p.growth_interval) != (
                2.0 ** 16, 2.0, 0.5, 2000):
            raise _refuse("precision.dtype", p.dtype, "fp16 uses dynamic loss scaling with GradScaler's defaults")
        out["fp16"] = True
    elif p.dtype == "bfloat16":
        out["bf16"] = True
    return out, notes
