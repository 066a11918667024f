"""`from_optax`: an optax-flavoured description (TOML file or dict) as twinstep's spec sections.

    spec = from_optax("optax.toml")          # or from_optax({"optax": {"chain": [...]}})

The building blocks (optax_desc) must read, in order:

    [scale(-1)] [clip_by_global_norm | clip] [add_decayed_weights: coupled, L2]    gradient side
    core: scale_by_adam | scale_by_amsgrad | scale_by_rms | scale_by_stddev | scale_by_rss |
          scale_by_adamax | scale_by_lion | scale_by_ademamix | trace | (none: plain SGD)
    [trace (rms, stddev)] [add_decayed_weights: decoupled] scale_by_learning_rate [trace]
    [clip] [clip_by_global_norm]      the updates clipped (clip.target = "updates"; not both sides)

or optax.contrib's schedule_free_adamw / schedule_free_sgd alone (after clipping), without a
warm-up (optax evaluates it one count ahead of schedulefree: SF-OPTAX; no spec field says so),
or optax.contrib's prodigy (after clipping and a coupled add_decayed_weights: prodigyopt's
decouple = false), always bias-corrected and uncapped as optax's is (PR-BC).

and become the spec with optax's semantics kept (eps_in_sqrt, eps_root, amsgrad_variant,
momentum_schedule = false, clip eps = 0, optax's defaults). Anything else is refused with
UnsupportedError saying what and why; malformed descriptions raise ConfigError naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conformance.errors import ConfigError, UnsupportedError
from conformance.port.read.from_torch import validated
from conformance.port.read.optax_desc import DTYPE_ARGS, Block, read
from conformance.port.read.optax_sched import schedule

CORES = ("scale_by_adam", "scale_by_amsgrad", "scale_by_rms", "scale_by_stddev", "scale_by_rss",
         "scale_by_adamax", "scale_by_lion", "scale_by_ademamix", "trace")
PASS_THROUGH = ("model", "data", "loss", "precision", "checkpoint", "run")


def _gradient_side(bs: list[Block]) -> tuple[int, dict[str, Any], float | None, bool]:
    """(index of the core, clip table, coupled weight decay, maximize) from the leading blocks."""
    clip: dict[str, Any] = {}
    decay: float | None = None
    maximize = False
    i = 0
    while i < len(bs) and bs[i].name in ("scale", "clip_by_global_norm", "clip", "add_decayed_weights"):
        b = bs[i]
        if b.name == "scale":
            if b.args["step_size"] != -1 or maximize or decay is not None or i + 1 == len(bs):
                break  # not scale(-1) first: maybe the lr as scale(-lr), read below
            maximize = True
        elif b.name == "add_decayed_weights":
            decay = _decay(b)
        elif decay is not None:
            _refuse_second_clip(b, clip)
            raise UnsupportedError(f"{b.where} clips g + weight_decay·p; twinstep (like torch) clips the gradient "
                                   f"before the optimizer adds the decay: clip first")
        else:
            clip = _clip_table(b, clip)
        i += 1
    return i, clip, decay, maximize


def _refuse_second_clip(b: Block, clip: dict[str, Any]) -> None:
    # one clipping transform, or the norm after a clip by value
    if clip and not (set(clip) == {"clip_value"} and b.name == "clip_by_global_norm"):
        raise UnsupportedError(f"{b.where}: a second clipping transform; twinstep clips once, or by value "
                               "then by norm (optax.chain(optax.clip(v), optax.clip_by_global_norm(c)))")


def _clip_table(b: Block, clip: dict[str, Any]) -> dict[str, Any]:
    """`clip` with the clipping block `b` (clip or clip_by_global_norm) read into it."""
    _refuse_second_clip(b, clip)
    if b.name == "clip":
        return {"clip_value": _positive(b.args["max_delta"], f"{b.where}.max_delta")}
    return {**clip, "max_norm": _positive(b.args["max_norm"], f"{b.where}.max_norm"), "eps": 0.0}


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where} must be a number > 0; received {value!r}")
    return float(value)


def _decay(b: Block) -> float:
    if b.args["mask"] is not None:
        raise UnsupportedError(f"{b.where}.mask is a Python function in optax; list the parameters it leaves "
                               f"undecayed as no_weight_decay = [glob patterns] in the [optax] table")
    wd = b.args["weight_decay"]
    if isinstance(wd, bool) or not isinstance(wd, (int, float)):
        raise UnsupportedError(f"{b.where}.weight_decay must be a number; a weight-decay schedule has no spec field")
    return float(wd)


def _learning_rate(bs: list[Block], i: int) -> tuple[Any, int, str]:
    """(learning-rate description, index after it, where) from scale_by_learning_rate or scale(-lr)."""
    if i >= len(bs):
        raise UnsupportedError("the chain has no learning rate (scale_by_learning_rate, or an optimizer alias)")
    b = bs[i]
    if b.name == "scale_by_learning_rate":
        if not b.args["flip_sign"]:
            raise UnsupportedError(f"{b.where}.flip_sign = false ascends the gradient; use maximize (scale(-1) "
                                   f"first in the chain) if that is meant")
        if b.args["learning_rate"] is None:
            raise ConfigError(f"{b.where}.learning_rate is required")
        return b.args["learning_rate"], i + 1, f"{b.where}.learning_rate"
    if b.name == "scale" and isinstance(b.args["step_size"], (int, float)) and b.args["step_size"] < 0:
        return -float(b.args["step_size"]), i + 1, f"{b.where}.step_size"
    raise UnsupportedError(f"{b.where}: expected the learning rate (scale_by_learning_rate) here; twinstep "
                           f"cannot express optax.{b.name} in this position")


def _core(b: Block | None, momentum: float) -> dict[str, Any]:
    """The spec optimizer fields of the core block (None: plain SGD)."""
    if b is None:
        return {"name": "sgd", "momentum": momentum}
    a = b.args
    if b.name in ("scale_by_adam", "scale_by_amsgrad"):
        out: dict[str, Any] = {"name": "adam", "betas": [a["b1"], a["b2"]], "eps": a["eps"]}
        if b.name == "scale_by_amsgrad":
            if not a["bias_correction_mu"]:
                raise UnsupportedError(f"{b.where}.bias_correction_mu = false has no spec field")
            out.update(amsgrad=True, amsgrad_variant="optax" if a["bias_correction_nu"] else "optax_raw")
        elif a["nesterov"]:  # optax.nadam: Adam with Nesterov and a constant beta1
            if a["eps_root"]:
                raise UnsupportedError(f"{b.where}: nesterov with eps_root = {a['eps_root']} has no spec field "
                                       f"(twinstep's nadam has no eps_root)")
            return {"name": "nadam", "betas": out["betas"], "eps": a["eps"], "momentum_schedule": False}
        return {**out, "eps_root": a["eps_root"]}
    if b.name in ("scale_by_rms", "scale_by_stddev"):
        for key in ("initial_scale", "bias_correction"):
            if a[key]:
                raise UnsupportedError(f"{b.where}.{key} = {a[key]!r} has no spec field (twinstep's rmsprop "
                                       f"starts at 0 without bias correction, as torch's)")
        return {"name": "rmsprop", "alpha": a["decay"], "eps": a["eps"], "eps_in_sqrt": a["eps_in_sqrt"],
                "centered": b.name == "scale_by_stddev", "momentum": momentum}
    if b.name == "scale_by_rss":
        return {"name": "adagrad", "initial_accumulator_value": a["initial_accumulator_value"], "eps": a["eps"],
                "eps_in_sqrt": True}
    if b.name == "scale_by_adamax":
        return {"name": "adamax", "betas": [a["b1"], a["b2"]], "eps": a["eps"]}
    if b.name == "scale_by_ademamix":
        return _ademamix(b)
    if a["mode"] != "hard":
        raise UnsupportedError(f"{b.where}.mode = {a['mode']!r}: twinstep's lion is the original (hard) sign")
    return {"name": "lion", "betas": [a["b1"], a["b2"]]}


def _ademamix(b: Block) -> dict[str, Any]:
    a = b.args
    for key in ("b3", "alpha"):
        if isinstance(a[key], Mapping):
            raise UnsupportedError(f"{b.where}.{key}: optax.contrib.ademamix calls its {key} schedule with the count "
                                   f"before its increment, one behind the paper's reference (AD-COUNT), and twinstep's "
                                   f"warm-ups are the reference's; give a number and set beta3_warmup / alpha_warmup "
                                   f"in the spec instead")
    if a["eps_root"]:
        raise UnsupportedError(f"{b.where}.eps_root = {a['eps_root']} has no spec field (twinstep's ademamix is the "
                               f"reference's, without eps_root)")
    return {"name": "ademamix", "betas": [a["b1"], a["b2"]], "beta3": a["b3"], "alpha": a["alpha"], "eps": a["eps"]}


def _trace(b: Block, core: Block | None) -> float:
    if core is not None and core.name not in ("scale_by_rms", "scale_by_stddev"):
        raise UnsupportedError(f"{b.where}: a trace after optax.{core.name} has no spec field")
    if b.args["nesterov"] and core is not None:
        raise UnsupportedError(f"{b.where}: rmsprop with nesterov has no spec field (torch's RMSprop has none)")
    return float(b.args["decay"])


def _schedule_free(b: Block, clip: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any, str]:
    a = b.args
    if a["warmup_steps"]:
        raise UnsupportedError(f"{b.where}.warmup_steps: optax.contrib.schedule_free evaluates its warm-up one "
                               f"count ahead of the schedulefree package (SF-OPTAX, optax PR #1744), which no spec "
                               f"field expresses; port the package's optimizer, or leave warmup_steps unset")
    if a["state_dtype"] is not None:
        raise UnsupportedError(f"{b.where}.state_dtype = {a['state_dtype']!r}: state dtypes follow the parameters")
    fields: dict[str, Any] = {"name": b.name, "weight_decay": float(a["weight_decay"] or 0.0),
                              "weight_lr_power": a["weight_lr_power"]}
    if b.name == "schedule_free_adamw":
        fields.update(betas=[a["b1"], a["b2"]], eps=a["eps"])
    else:
        fields["momentum"] = a["b1"]
    return fields, clip, a["learning_rate"], f"{b.where}.learning_rate"


def _prodigy(b: Block, clip: dict[str, Any], coupled: float | None) -> tuple[dict[str, Any], dict[str, Any], Any, str]:
    a = b.args
    if coupled is not None and a["weight_decay"]:
        raise UnsupportedError("the chain adds weight decay both before and inside optax.contrib.prodigy; twinstep "
                               "has one")
    betas = [float(x) for x in a["betas"]]
    fields: dict[str, Any] = {"name": "prodigy", "betas": betas, "eps": a["eps"], "d0": a["estim_lr0"],
                              "d_coef": a["estim_lr_coef"], "safeguard_warmup": a["safeguard_warmup"],
                              "use_bias_correction": True,  # optax always bias-corrects (PR-BC)
                              "weight_decay": float(coupled if coupled is not None else a["weight_decay"]),
                              "decouple": coupled is None}
    if a["beta3"] is not None:  # None: √β2, the spec's default too
        fields["beta3"] = a["beta3"]
    return fields, clip, a["learning_rate"], f"{b.where}.learning_rate"


def _update_clip(bs: list[Block], i: int, clip: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """optax.clip / clip_by_global_norm after the optimizer clip its updates: clip.target = "updates"
    (by value, by norm, or by value then by norm); (index after them, the clip table)."""
    out: dict[str, Any] = {}
    while i < len(bs) and bs[i].name in ("clip", "clip_by_global_norm"):
        b = bs[i]
        if clip:
            raise UnsupportedError(f"{b.where}: the gradients are clipped already; twinstep clips the gradients "
                                   "or the updates (clip.target), not both")
        out = _clip_table(b, out)
        i += 1
    return i, ({**out, "target": "updates"} if out else clip)


def optimizer(bs: list[Block]) -> tuple[dict[str, Any], dict[str, Any], Any, str]:
    """(optimizer fields without lr, clip table, learning-rate description, its where) of the blocks."""
    i, clip, coupled, maximize = _gradient_side(bs)
    if i < len(bs) and bs[i].name == "prodigy":
        if maximize or i + 1 != len(bs):
            raise UnsupportedError(f"{bs[i].where}: optax.contrib.prodigy is read alone (after clipping and a "
                                   f"coupled weight decay only)")
        return _prodigy(bs[i], clip, coupled)
    if i < len(bs) and bs[i].name.startswith("schedule_free_"):
        if maximize or coupled is not None or i + 1 != len(bs):
            raise UnsupportedError(f"{bs[i].where}: optax.contrib.{bs[i].name} is read alone (after clipping only)")
        return _schedule_free(bs[i], clip)
    core = bs[i] if i < len(bs) and bs[i].name in CORES and bs[i].name != "trace" else None
    momentum, nesterov = 0.0, False
    if core is not None:
        i += 1
    elif i < len(bs) and bs[i].name == "trace":  # SGD with momentum
        momentum, nesterov = float(bs[i].args["decay"]), bool(bs[i].args["nesterov"]) and bs[i].args["decay"] > 0
        i += 1
    if core is not None and i < len(bs) and bs[i].name == "trace":
        momentum, i = _trace(bs[i], core), i + 1  # torch's order: the buffer before the lr
    decoupled = None
    if i < len(bs) and bs[i].name == "add_decayed_weights":
        decoupled, i = _decay(bs[i]), i + 1
    lr, i, lr_where = _learning_rate(bs, i)
    after_lr = None
    if i < len(bs) and bs[i].name == "trace":
        after_lr, i = bs[i], i + 1
    i, clip = _update_clip(bs, i, clip)
    if i < len(bs):
        raise UnsupportedError(f"{bs[i].where}: optax.{bs[i].name} after the learning rate has no spec field")
    fields = _core(core, momentum)
    if after_lr is not None:
        if fields["name"] not in ("sgd", "rmsprop") or momentum:
            raise UnsupportedError(f"{after_lr.where}: a trace after the learning rate has no spec field here")
        if not isinstance(lr, (int, float)):
            raise UnsupportedError(f"{after_lr.where}: optax's {fields['name']} applies the lr before its momentum "
                                   f"trace, which differs from torch's order under a schedule (O-RMSPROP-LR); "
                                   f"write chain(scale_by_rms, trace, scale_by_learning_rate) to mean torch's")
        fields["momentum"] = _trace(after_lr, core)  # equal to torch's order with a constant lr
        nesterov = bool(after_lr.args["nesterov"]) and fields["name"] == "sgd"
    if fields["name"] == "sgd":
        fields["nesterov"] = nesterov and fields["momentum"] > 0
    fields.update(_weight_decay(fields["name"], coupled, decoupled, bs))
    if maximize:
        fields["maximize"] = True
    return fields, clip, lr, lr_where


def _weight_decay(name: str, coupled: float | None, decoupled: float | None, bs: list[Block]) -> dict[str, Any]:
    if coupled is not None and decoupled is not None:
        raise UnsupportedError("the chain adds weight decay both before and after the moments; twinstep has one")
    if decoupled is not None:
        if name == "adam":
            return {"name": "adamw", "weight_decay": decoupled}
        if name == "nadam":
            return {"weight_decay": decoupled, "decoupled_weight_decay": True}
        if name in ("lion", "ademamix"):
            return {"weight_decay": decoupled}
        # add_decayed_weights after the moments, before the lr: -lr·(u + wd·p), torch AdamW's decay
        return {"weight_decay": decoupled, "decoupled_weight_decay": True}
    if coupled is not None:
        if name in ("lion", "ademamix"):
            raise UnsupportedError(f"weight decay before scale_by_{name} has no spec field ({name}'s decay is "
                                   f"decoupled: put add_decayed_weights after it)")
        return {"weight_decay": coupled}
    return {"weight_decay": 0.0}


def _load(description: Any) -> dict[str, Any]:
    if isinstance(description, (str, Path)):
        from conformance.config import load_toml

        data = load_toml(description)
        where = f"{description}: "
    elif isinstance(description, Mapping):
        data, where = dict(description), ""
    else:
        raise ConfigError(f"an optax description is a TOML path or a dict; received {type(description).__name__}")
    unknown = [k for k in data if k != "optax" and k not in PASS_THROUGH]
    if "optax" not in data or unknown:
        what = f"unknown section {unknown[0]!r}" if unknown else "no [optax] table"
        raise ConfigError(f"{where}{what}: an optax description has [optax] and optionally "
                          f"{', '.join('[' + s + ']' for s in PASS_THROUGH)}")
    return data


def _state_dtypes(bs: list[Block], precision: Mapping[str, Any]) -> None:
    """optax's mu_dtype / accumulator_dtype name the dtype a state tensor is kept in; twinstep keeps
    every state tensor in the master dtype ([precision] param_dtype: float64 for float64 runs, else
    float32), so the description reads only when they name that dtype (O-STATE-DTYPE)."""
    master = "float64" if precision.get("dtype") == "float64" else "float32"
    for b in bs:
        for key in DTYPE_ARGS:
            value = b.args.get(key)
            name = None if value is None else str(value).removeprefix("jax.numpy.").removeprefix("jnp.")
            if name is not None and name != master:
                raise UnsupportedError(f"{b.where}.{key} = {value!r}: optax would keep that state in {name}; "
                                       f"twinstep keeps optimizer state in the master dtype {master} "
                                       f"(O-STATE-DTYPE): leave it unset or write {master!r}")


# Building blocks whose arguments optax.inject_hyperparams may schedule: argument -> [schedule.hyper] key.
_BETAS = {"b1": "beta1", "b2": "beta2"}
_ADAM = {**_BETAS, "eps": "eps"}
_RMS = {"decay": "alpha", "eps": "eps"}  # optax's rmsprop decay is torch's alpha
HYPER_ARGS: dict[str, dict[str, str]] = {
    "scale_by_adam": _ADAM, "scale_by_amsgrad": _ADAM, "scale_by_adamax": _ADAM, "scale_by_lion": _BETAS,
    "scale_by_rms": _RMS, "scale_by_stddev": _RMS,
    "trace": {"decay": "momentum"}, "add_decayed_weights": {"weight_decay": "weight_decay"},
}


def _hyper_schedules(bs: list[Block]) -> tuple[list[Block], dict[str, Any]]:
    """Arguments given as schedules inside inject_hyperparams: the blocks with each schedule's base
    value in its place, and the `[schedule.hyper]` tables (relative to that base, as the lr's)."""
    out, hyper = [], {}
    for b in bs:
        args = dict(b.args)
        for arg, key in HYPER_ARGS.get(b.name, {}).items():
            if not isinstance(args.get(arg), Mapping):
                continue
            where = f"{b.where}.{arg}"
            if "inject_hyperparams" not in b.where:
                raise UnsupportedError(f"{where} is a schedule: optax takes one for the learning rate only; wrap the "
                                       f"transform in inject_hyperparams to schedule {arg}")
            if key in hyper:
                raise UnsupportedError(f"{where}: a second schedule of {key}; [schedule.hyper] holds one per key")
            args[arg], hyper[key] = schedule(args[arg], where)
        out.append(b._replace(args=args))
    return out, hyper


def from_optax(description: Any) -> dict[str, Any]:
    """The spec sections (optimizer, schedule, clip, accumulation; other twinstep sections of the
    file pass through) of an optax-flavoured description, keeping optax's semantics exactly."""
    data = _load(description)
    bs, multi, no_decay = read(data["optax"])
    _state_dtypes(bs, data.get("precision") or {})
    bs, hyper = _hyper_schedules(bs)
    fields, clip, lr, lr_where = optimizer(bs)
    base, sched = schedule(lr, lr_where)
    if hyper:
        sched = {**sched, "hyper": hyper}
    out: dict[str, Any] = {k: v for k, v in data.items() if k != "optax"}
    out["optimizer"] = {**fields, "lr": base, **({"no_weight_decay": no_decay} if no_decay else {})}
    out["schedule"] = sched
    if clip:
        out["clip"] = clip
    if multi:
        k = multi["every_k_schedule"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise UnsupportedError(f"optax.MultiSteps.every_k_schedule = {k!r}: twinstep accumulates a fixed "
                                   f"number (an integer >= 1) of micro-batches per update")
        if not multi["use_grad_mean"]:
            raise UnsupportedError("optax.MultiSteps.use_grad_mean = false sums the gradients; twinstep's "
                                   "accumulation averages them (normalize = 'micro_batches')")
        if multi["should_skip_update_fn"] is not None:
            raise UnsupportedError("optax.MultiSteps.should_skip_update_fn is a Python function; use [precision]")
        out["accumulation"] = {"steps": k, "normalize": "micro_batches"}
    return validated(out, "the optax description")
