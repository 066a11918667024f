"""Parse an optax-flavoured description into a flat list of optax building blocks.

optax builds closures, so a set-up is described with optax's own names and arguments:

    [optax]
    chain = [{clip_by_global_norm = {max_norm = 1.0}},
             {adamw = {learning_rate = {warmup_cosine_decay_schedule = {...}}, b1 = 0.9, weight_decay = 1e-4}}]
    no_weight_decay = ["*.bias"]        # twinstep's name for what an optax `mask` leaves undecayed

A transform is `{name = {arguments}}`, `{chain = [...]}` or a list (a chain); `MultiSteps = {opt =
..., every_k_schedule = 4}` wraps the whole chain. Aliases expand into the blocks optax builds them
from (optax/_src/alias.py), e.g. adamw = scale_by_adam, add_decayed_weights, scale_by_learning_rate,
and rmsprop puts scale_by_learning_rate *before* its trace, as optax does; optax.contrib's ademamix
and schedule-free optimizers are read by the same names, and `{inject_hyperparams = {adamw = {...}}}`
(optax.inject_hyperparams(optax.adamw)(...)) as the transform it wraps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from conformance.errors import ConfigError, UnsupportedError
from conformance.port.read.optax_sched import REQUIRED, arguments

_ADAM = {"b1": 0.9, "b2": 0.999, "eps": 1e-8, "eps_root": 0.0, "mu_dtype": None}
_LR = {"learning_rate": REQUIRED}
# optax 0.2.8 signatures: argument -> default (tests/test_port_optax.py checks them against optax)
TRANSFORMS: dict[str, dict[str, Any]] = {
    "sgd": {**_LR, "momentum": None, "nesterov": False, "accumulator_dtype": None},
    "adam": {**_LR, **_ADAM, "nesterov": False},
    "adamw": {**_LR, **_ADAM, "weight_decay": 1e-4, "mask": None, "nesterov": False},
    "nadam": {**_LR, **_ADAM, "nesterov": True},
    "nadamw": {**_LR, **_ADAM, "weight_decay": 1e-4, "mask": None, "nesterov": True},
    "amsgrad": {**_LR, **_ADAM, "bias_correction_mu": True, "bias_correction_nu": True},
    "rmsprop": {**_LR, "decay": 0.9, "eps": 1e-8, "initial_scale": 0.0, "eps_in_sqrt": True, "centered": False,
                "momentum": None, "nesterov": False, "bias_correction": False},
    "adagrad": {**_LR, "initial_accumulator_value": 0.1, "eps": 1e-7},
    "adamax": {**_LR, "b1": 0.9, "b2": 0.999, "eps": 1e-8},
    "radam": {**_LR, **{k: v for k, v in _ADAM.items() if k != "mu_dtype"}, "threshold": 5.0, "nesterov": False},
    "lion": {**_LR, "b1": 0.9, "b2": 0.99, "mu_dtype": None, "weight_decay": 1e-3, "mask": None},
    "adafactor": {"learning_rate": None, "min_dim_size_to_factor": 128, "decay_rate": 0.8, "decay_offset": 0,
                  "multiply_by_parameter_scale": True, "clipping_threshold": 1.0, "momentum": None,
                  "dtype_momentum": "float32", "weight_decay_rate": None, "eps": 1e-30, "factored": True,
                  "weight_decay_mask": None},
    "clip_by_global_norm": {"max_norm": REQUIRED},
    "clip": {"max_delta": REQUIRED},
    "add_decayed_weights": {"weight_decay": 0.0, "mask": None},
    "scale": {"step_size": REQUIRED},
    "scale_by_learning_rate": {"learning_rate": None, "flip_sign": True},
    "scale_by_adam": {**_ADAM, "nesterov": False},
    "scale_by_amsgrad": {**_ADAM, "bias_correction_mu": True, "bias_correction_nu": True},
    "scale_by_rms": {"decay": 0.9, "eps": 1e-8, "initial_scale": 0.0, "eps_in_sqrt": True, "bias_correction": False},
    "scale_by_stddev": {"decay": 0.9, "eps": 1e-8, "initial_scale": 0.0, "eps_in_sqrt": True,
                        "bias_correction": False},
    "scale_by_rss": {"initial_accumulator_value": 0.1, "eps": 1e-7},
    "scale_by_adamax": {"b1": 0.9, "b2": 0.999, "eps": 1e-8},
    "scale_by_lion": {"b1": 0.9, "b2": 0.99, "mu_dtype": None, "mode": "hard", "smooth_beta": 1.0},
    "trace": {"decay": REQUIRED, "nesterov": False, "accumulator_dtype": None},
    "schedule_free_adamw": {"learning_rate": 0.0025, "warmup_steps": None, "b1": 0.9, "b2": 0.999, "eps": 1e-8,
                           "weight_decay": 0.0, "weight_lr_power": 2.0, "state_dtype": None},
    "schedule_free_sgd": {"learning_rate": 1.0, "warmup_steps": None, "b1": 0.9, "weight_decay": None,
                          "weight_lr_power": 2.0, "state_dtype": None},
    "ademamix": {**_LR, "b1": 0.9, "b2": 0.999, "b3": 0.9999, "alpha": 5.0, "eps": 1e-8, "eps_root": 0.0,
                 "mu_dtype": None, "weight_decay": 0.0, "mask": None},
    "scale_by_ademamix": {"b1": 0.9, "b2": 0.999, "b3": 0.9999, "alpha": 6.0, "eps": 1e-8, "eps_root": 0.0,
                          "mu_dtype": None},
    "prodigy": {"learning_rate": 1.0, "betas": (0.9, 0.999), "beta3": None, "eps": 1e-8, "estim_lr0": 1e-6,
                "estim_lr_coef": 1.0, "weight_decay": 0.0, "safeguard_warmup": False},
    "MultiSteps": {"opt": REQUIRED, "every_k_schedule": REQUIRED, "use_grad_mean": True,
                   "should_skip_update_fn": None, "accumulator_dtype": "float32"},
}
REFUSED = {
    "radam": "optax.radam adds eps to sqrt(v_hat) and rectifies when rho_t >= threshold; twinstep's radam is "
             "torch's (eps on the raw sqrt(v), rho_t > 5) and no field expresses optax's variant (O-RADAM)",
    "adafactor": "optax.adafactor differs from twinstep's (torch's) Adafactor in its factoring rule, eps, "
                 "relative step, weight decay and float32 decay rate (O-ADAFACTOR); no spec expresses it",
    "apply_if_finite": "optax applies the non-finite update after max_consecutive_errors; twinstep skips "
                       "(or raises) — use [precision] on_nonfinite",
    "zero_nans": "optax.zero_nans sets NaN gradient entries to 0 and applies the update; twinstep never "
                 "applies a non-finite update (P-IFFINITE) — use [precision] on_nonfinite",
    "muon": "optax.contrib.muon is another algorithm than twinstep's muon, which is torch.optim.Muon's "
            "(bias-corrected momentum, its own normalisation and width scaling, an AdamW for the rest: O-MUON); "
            "write the spec's muon with [optimizer.fallback] instead",
}
INJECT = {"static_args": (), "hyperparam_dtype": None}  # optax.inject_hyperparams(inner, ...)'s own arguments
DTYPE_ARGS = ("mu_dtype", "accumulator_dtype")  # optimizer state dtypes: from_optax checks them (O-STATE-DTYPE)


class Block(NamedTuple):
    """One optax building block: its name, arguments (defaults filled) and where it was written."""

    name: str
    args: dict[str, Any]
    where: str


def _alias(name: str, a: dict[str, Any], at: str) -> list[Block]:
    """The building blocks optax builds an alias from, in optax's order."""
    lr = Block("scale_by_learning_rate", {"learning_rate": a.get("learning_rate"), "flip_sign": True}, at)
    adam = {k: a[k] for k in ("b1", "b2", "eps", "eps_root", "mu_dtype") if k in a}
    if name in ("adam", "nadam"):
        return [Block("scale_by_adam", {**adam, "nesterov": a["nesterov"]}, at), lr]
    if name in ("adamw", "nadamw"):
        return [Block("scale_by_adam", {**adam, "nesterov": a["nesterov"]}, at),
                Block("add_decayed_weights", {"weight_decay": a["weight_decay"], "mask": a["mask"]}, at), lr]
    if name == "amsgrad":
        return [Block("scale_by_amsgrad", {**adam, "bias_correction_mu": a["bias_correction_mu"],
                                           "bias_correction_nu": a["bias_correction_nu"]}, at), lr]
    if name == "sgd":
        trace = [] if a["momentum"] is None else [Block("trace", {"decay": a["momentum"], "nesterov": a["nesterov"],
                                                                  "accumulator_dtype": a["accumulator_dtype"]}, at)]
        return [*trace, lr]
    if name == "rmsprop":
        kind = "scale_by_stddev" if a["centered"] else "scale_by_rms"
        rms = Block(kind, {k: a[k] for k in ("decay", "eps", "initial_scale", "eps_in_sqrt", "bias_correction")}, at)
        trace = [] if a["momentum"] is None else [Block("trace", {"decay": a["momentum"], "nesterov": a["nesterov"],
                                                                  "accumulator_dtype": None}, at)]
        return [rms, lr, *trace]  # optax multiplies by the lr before its trace (O-RMSPROP-LR)
    if name == "adagrad":
        return [Block("scale_by_rss", {"initial_accumulator_value": a["initial_accumulator_value"],
                                       "eps": a["eps"]}, at), lr]
    if name == "adamax":
        return [Block("scale_by_adamax", {k: a[k] for k in ("b1", "b2", "eps")}, at), lr]
    if name == "lion":
        return [Block("scale_by_lion", {"b1": a["b1"], "b2": a["b2"], "mu_dtype": a["mu_dtype"], "mode": "hard",
                                        "smooth_beta": 1.0}, at),
                Block("add_decayed_weights", {"weight_decay": a["weight_decay"], "mask": a["mask"]}, at), lr]
    if name == "ademamix":
        core = {k: a[k] for k in ("b1", "b2", "b3", "alpha", "eps", "eps_root", "mu_dtype")}
        return [Block("scale_by_ademamix", core, at),
                Block("add_decayed_weights", {"weight_decay": a["weight_decay"], "mask": a["mask"]}, at), lr]
    return [Block(name, a, at)]


def _injected(args: Any, at: str) -> list[Block]:
    """`{inject_hyperparams = {adamw = {...}}}`: optax.inject_hyperparams(optax.adamw)(...) computes
    what the inner transform computes (its hyper-parameters become state, as twinstep's are); the
    inner transform is read in its place."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"{at} must be a table with one transform, e.g. {{adamw = {{learning_rate = 1e-3}}}}")
    inner = {k: v for k, v in args.items() if k not in INJECT}
    if len(inner) != 1 or next(iter(inner)) in ("chain", "MultiSteps", "inject_hyperparams"):
        raise ConfigError(f"{at} wraps one optax transform factory (adamw, sgd, ...) with its arguments, "
                          f"optionally static_args and hyperparam_dtype; received {', '.join(inner) or 'none'}")
    if args.get("hyperparam_dtype") is not None:
        raise UnsupportedError(f"{at}.hyperparam_dtype = {args['hyperparam_dtype']!r}: the injected hyper-parameters "
                               f"would be held in that dtype; twinstep's follow the parameters' — leave it unset")
    return blocks(inner, at)


def blocks(tx: Any, where: str) -> list[Block]:
    """A transform description (see the module docstring) as a flat list of building blocks."""
    if isinstance(tx, list):
        return [b for i, item in enumerate(tx) for b in blocks(item, f"{where}[{i}]")]
    if not isinstance(tx, Mapping) or len(tx) != 1:
        raise ConfigError(f"{where} must be one optax transform {{name = {{arguments}}}} or a list of them; "
                          f"received {tx!r}")
    (name, args), = tx.items()
    at = f"{where}.{name}"
    if name == "chain":
        return blocks(args, at)
    if name in REFUSED:
        raise UnsupportedError(f"optax.{name} cannot be translated: {REFUSED[name]}")
    if name == "inject_hyperparams":
        return _injected(args, at)
    if name not in TRANSFORMS:
        raise UnsupportedError(f"{at}: twinstep reads the optax transforms chain, {', '.join(TRANSFORMS)}")
    if name == "MultiSteps":
        raise ConfigError(f"{at}: MultiSteps must wrap the whole description ([optax.MultiSteps] with opt = ...)")
    return _alias(name, arguments(name, args, at, TRANSFORMS), at)


def read(description: Mapping[str, Any], where: str = "optax") -> tuple[list[Block], dict[str, Any], list[str] | None]:
    """(building blocks, MultiSteps arguments or {}, no_weight_decay patterns) of an [optax] table."""
    if not isinstance(description, Mapping):
        raise ConfigError(f"{where} must be a table; received {description!r}")
    table = dict(description)
    no_decay = table.pop("no_weight_decay", None)
    if no_decay is not None and (not isinstance(no_decay, list) or not all(isinstance(p, str) and p for p in no_decay)):
        raise ConfigError(f"{where}.no_weight_decay must be a list of glob patterns; received {no_decay!r}")
    multi: dict[str, Any] = {}
    if "MultiSteps" in table:
        if len(table) != 1:
            raise ConfigError(f"{where}.MultiSteps wraps the whole chain: put it in opt = ...; received also "
                              f"{', '.join(k for k in table if k != 'MultiSteps')}")
        multi = arguments("MultiSteps", table["MultiSteps"], f"{where}.MultiSteps", TRANSFORMS)
        inner = multi["opt"]
        return blocks(inner, f"{where}.MultiSteps.opt"), multi, no_decay
    if not table:
        raise ConfigError(f"{where} needs a chain = [...] or one transform, e.g. adamw = {{learning_rate = 1e-3}}")
    return blocks(table if len(table) == 1 else [{k: v} for k, v in table.items()], where), multi, no_decay
