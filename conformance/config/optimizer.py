"""`[optimizer]` and `[[optimizer.groups]]`: torch.optim vocabulary, torch defaults.

    [optimizer]
    name = "adamw"                 # see OPTIMIZER_NAMES
    lr = 3e-4
    betas = [0.9, 0.999]
    weight_decay = 0.01
    no_weight_decay = ["*.bias", "*norm*.weight"]   # the usual exclusions, one line

    [[optimizer.groups]]           # torch param groups, selected by glob patterns over names
    params = ["backbone.*"]
    lr = 1e-5                      # any hyper-parameter of the optimizer can be overridden

Every field is a torch constructor argument (snake_case) with torch's default for the chosen
optimizer (SGD lr 1e-3, RMSprop 1e-2, NAdam 2e-3, AdamW weight_decay 1e-2, Muon 0.1, ...). Fields
an optimizer does not read stay None and setting them is an error naming the field, so the
resolved config (dump_config) lists exactly the values in force.

Semantics that torch.optim cannot express are explicit extra fields, implemented on both backends:

- `eps_root` (adam, adamw): optax's term inside the square root, sqrt(v_hat + eps_root) + eps.
- `amsgrad_variant` (adam, adamw with amsgrad): "torch" keeps the max of the raw v and
  bias-corrects it; "optax" keeps the max of the bias-corrected v_hat (optax.scale_by_amsgrad);
  "optax_raw" keeps the max of the raw v without any bias correction (bias_correction_nu=False).
- `eps_in_sqrt` (rmsprop, adagrad): eps inside the square root, 1/sqrt(v + eps) as optax's
  rmsprop and adagrad (for adagrad also optax's guard: 0 where the accumulator is 0).
- `momentum_schedule` (nadam): false is optax.nadam: constant beta1, no Dozat momentum schedule.
- `ns_dtype` (muon): torch.optim.Muon runs Newton–Schulz in bfloat16; "float32"/"float64" run it
  in that dtype (twinstep's extension, exact across backends).
- `decoupled_weight_decay` (every optimizer whose decay torch couples: sgd, adam, rmsprop, adagrad,
  adamax, nadam, radam): true decays as torch.optim.AdamW, Keras and optax's add_decayed_weights
  chains do, p ← p·(1 − lr·wd) before the step with the group's lr (adagrad: not its lr_decay'ed
  rate); false is torch's L2, g ← g + wd·p. adamw, lion, adafactor and muon always decay so.
- `eps_hat` (adam, adamw, adamax, nadam): Keras/TensorFlow's "epsilon hat" placement. adam, adamw,
  nadam: ε is added to the raw √v and the bias correction moves into the step size,
  α = lr·√(1−β2ᵗ)/(1−β1ᵗ), p ← p − α·m/(√v + ε) (= torch's placement with ε/√(1−β2ᵗ)); adamax:
  u ← max(β2·u, |g|), p ← p − lr/(1−β1ᵗ)·m/(u + ε) (ε outside the max). Not with eps_root.
- `cautious` (lion): cautious updates (Liang et al. 2024, C-Optim) as pytorch-optimizer 4.1.0's
  `cautious=True` computes them: the update u is masked where it disagrees in sign with the
  gradient, per parameter tensor of n entries, u ← u·m·n/(Σm + 1) with m = [u·g > 0] (g after
  maximize's negation), before p ← p − lr·u; the decoupled decay is not masked.
- `cautious_weight_decay` (adamw, lion, muon, ademamix, and with decoupled_weight_decay = true sgd,
  adam, rmsprop, adagrad, adamax, nadam, radam): cautious weight decay (Chen et al. 2025,
  arXiv 2510.12402; nanochat's Muon, heavyball 3.2.1's `cautious_weight_decay=True`): the decoupled
  decay only where the step moves the parameter toward zero, p ← p − lr·u − lr·wd·p·[u·p ≥ 0] (u the
  step p moves against, lr the group's: Muon's decay ignores adjust_lr_fn, as torch.optim.Muon's).
  The twins read [u·p ≥ 0] off the step they took, (p − p')·p ≥ 0.

Schedule-free optimizers (facebookresearch `schedulefree`, its constructor names and defaults):
`schedule_free_adamw` (AdamWScheduleFree: lr 0.0025, betas, eps, weight_decay, warmup_steps, r,
weight_lr_power) and `schedule_free_sgd` (SGDScheduleFree: lr 1.0, momentum 0.9, ...). The
parameters they hold during training are the gradient point y; the point to evaluate and save is
the average x = (y − (1−β)·z)/β (conformance/oracle/optimizers.py has the equations; the trainers
switch to x before evaluating or saving and back after, as the package's optimizer.eval() /
train() document).

AdEMAMix (`ademamix`, Pagliardini et al. 2024, apple/ml-ademamix's torch class and names: its
betas (β1, β2, β3) are `betas` and `beta3` here, its None warm-ups 0): Adam's fast EMA plus a slow
EMA m_slow with β3, mixed as (m̂ + α·m_slow)/(√v̂ + ε), decoupled decay; `alpha_warmup` ramps α
linearly from 0 and `beta3_warmup` ramps β3 from β1 linearly in the EMA's half-life, both over the
parameter's update count t (1 at the first update; the oracle has the equations).

Prodigy (`prodigy`, Mishchenko & Defazio 2024; prodigyopt 1.1.2's class, names and defaults: lr
1.0, `beta3` √β2 when unset, `decouple` its AdamW-style decay): Adam whose step size d·lr
comes from one estimate d of the distance to the solution, shared by every parameter; `d0` starts
it, `d_coef` scales it, `growth_rate` caps its growth per update, `safeguard_warmup` drops lr from
the denominator's sum, `use_bias_correction` is Adam's. prodigyopt reads all but lr, weight_decay
and eps from its first group, and needs every group's lr equal or 0: the spec refuses the rest.

Muon only updates 2-D parameters: every other parameter, and 2-D ones matched by
`fallback_params`, is updated by `[optimizer.fallback]` (default: AdamW with torch's defaults), the
usual set-up for biases, norms, embeddings and heads. `conformance.rules.groups` turns the groups into
the parameter groups both backends build; `docs/divergences.md#optimizers` lists every difference
between torch.optim and optax and the case or test that pins it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from conformance.config.base import (
    FloatIn,
    IntIn,
    NonNegative,
    Pair,
    Positive,
    Section,
    UnitClosed,
    UnitHalfOpen,
    field_error,
)

OptimizerName = Literal[
    "sgd", "adam", "adamw", "rmsprop", "adagrad", "adamax", "nadam", "radam", "lion", "adafactor", "muon",
    "schedule_free_adamw", "schedule_free_sgd", "ademamix", "prodigy",
]
OPTIMIZER_NAMES: tuple[str, ...] = OptimizerName.__args__  # type: ignore[attr-defined]

_BETAS = (0.9, 0.999)
MUON_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim._muon DEFAULT_A/B/C (Keller Jordan)

# The hyper-parameters each optimizer reads, with torch's defaults (lion: lucidrains/lion-pytorch).
DEFAULTS: dict[str, dict[str, Any]] = {
    "sgd": {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "nesterov": False, "weight_decay": 0.0,
            "maximize": False, "decoupled_weight_decay": False, "cautious_weight_decay": False},
    "adam": {"lr": 1e-3, "betas": _BETAS, "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
             "decoupled_weight_decay": False, "maximize": False, "eps_root": 0.0,
             "amsgrad_variant": "torch", "eps_hat": False, "cautious_weight_decay": False},
    "adamw": {"lr": 1e-3, "betas": _BETAS, "eps": 1e-8, "weight_decay": 1e-2, "amsgrad": False,
              "maximize": False, "eps_root": 0.0, "amsgrad_variant": "torch", "eps_hat": False,
              "cautious_weight_decay": False},
    "rmsprop": {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0,
                "centered": False, "maximize": False, "eps_in_sqrt": False, "decoupled_weight_decay": False,
                "cautious_weight_decay": False},
    "adagrad": {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0,
                "eps": 1e-10, "maximize": False, "eps_in_sqrt": False, "decoupled_weight_decay": False,
                "cautious_weight_decay": False},
    "adamax": {"lr": 2e-3, "betas": _BETAS, "eps": 1e-8, "weight_decay": 0.0, "maximize": False,
               "decoupled_weight_decay": False, "eps_hat": False, "cautious_weight_decay": False},
    "nadam": {"lr": 2e-3, "betas": _BETAS, "eps": 1e-8, "weight_decay": 0.0, "momentum_decay": 4e-3,
              "decoupled_weight_decay": False, "maximize": False, "momentum_schedule": True, "eps_hat": False,
              "cautious_weight_decay": False},
    "radam": {"lr": 1e-3, "betas": _BETAS, "eps": 1e-8, "weight_decay": 0.0,
              "decoupled_weight_decay": False, "maximize": False, "cautious_weight_decay": False},
    "lion": {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0, "maximize": False, "cautious": False,
             "cautious_weight_decay": False},
    "adafactor": {"lr": 1e-2, "beta2_decay": -0.8, "eps": ("auto", 1e-3), "d": 1.0,
                  "weight_decay": 0.0, "maximize": False},
    "muon": {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
             "ns_coefficients": MUON_NS_COEFFICIENTS, "eps": 1e-7, "ns_steps": 5,
             "adjust_lr_fn": "original", "ns_dtype": "bfloat16", "cautious_weight_decay": False},
    # schedulefree 1.4.1's AdamWScheduleFree / SGDScheduleFree defaults
    "schedule_free_adamw": {"lr": 0.0025, "betas": _BETAS, "eps": 1e-8, "weight_decay": 0.0, "warmup_steps": 0,
                            "r": 0.0, "weight_lr_power": 2.0},
    "schedule_free_sgd": {"lr": 1.0, "momentum": 0.9, "weight_decay": 0.0, "warmup_steps": 0, "r": 0.0,
                          "weight_lr_power": 2.0},
    # apple/ml-ademamix's AdEMAMix (the paper's reference): betas[2] is beta3, None warm-ups are 0
    "ademamix": {"lr": 1e-3, "betas": _BETAS, "beta3": 0.9999, "alpha": 2.0, "beta3_warmup": 0,
                 "alpha_warmup": 0, "eps": 1e-8, "weight_decay": 0.0, "maximize": False,
                 "cautious_weight_decay": False},
    # prodigyopt 1.1.2's Prodigy and its names: beta3 None is √β2 (filled in from betas)
    "prodigy": {"lr": 1.0, "betas": _BETAS, "beta3": math.sqrt(_BETAS[1]), "eps": 1e-8, "weight_decay": 0.0,
                "decouple": True, "use_bias_correction": False, "safeguard_warmup": False,
                "d0": 1e-6, "d_coef": 1.0, "growth_rate": math.inf},
}

# Prodigy's fields a parameter group may set; prodigyopt reads every other one from its first group
PRODIGY_GROUP_FIELDS: tuple[str, ...] = ("lr", "weight_decay", "eps")

SCHEDULE_FREE: tuple[str, ...] = ("schedule_free_adamw", "schedule_free_sgd")
# weight decay that is p ← p·(1 − lr·wd) before the step whatever the config says
ALWAYS_DECOUPLED: tuple[str, ...] = ("adamw", "lion", "adafactor", "muon", "ademamix")

HYPERPARAMETERS: tuple[str, ...] = tuple(dict.fromkeys(k for d in DEFAULTS.values() for k in d))

# Which optimizers read which field (the inverse of DEFAULTS), for error messages.
USED_BY: dict[str, tuple[str, ...]] = {
    key: tuple(n for n in OPTIMIZER_NAMES if key in DEFAULTS[n]) for key in HYPERPARAMETERS
}

# Float hyper-parameters a running optimizer may change between updates (torch: param_group[k]);
# JAX keeps them as arrays in the optimizer state so that changing them never recompiles.
DYNAMIC: tuple[str, ...] = ("lr", "weight_decay", "momentum", "dampening", "betas", "eps", "alpha",
                            "lr_decay", "momentum_decay", "beta2_decay", "d", "beta3")


def _eps(value: Any) -> Any:
    # adafactor's eps is torch's pair (eps1, eps2); eps1 = "auto" is torch's None (finfo(dtype).eps)
    if isinstance(value, list):
        return tuple(value)
    return value


def _growth_rate(value: float) -> float:
    if math.isnan(value) or value < 1:
        raise PydanticCustomError("range", "must be >= 1 or inf (prodigyopt's default: no cap on d's growth)")
    return value


# the one field that may be inf: prodigyopt's growth_rate default (TOML writes it `inf`)
GrowthRate = Annotated[float, Field(allow_inf_nan=True), AfterValidator(_growth_rate)]

AdafactorEps = tuple[NonNegative | Literal["auto"], NonNegative]


class _Hyper(Section):
    """Every optimizer hyper-parameter; None = not set (resolved per optimizer)."""

    lr: NonNegative | None = None
    momentum: NonNegative | None = None
    dampening: UnitClosed | None = None
    nesterov: bool | None = None
    weight_decay: NonNegative | None = None
    maximize: bool | None = None
    betas: Pair(UnitHalfOpen) | None = None
    eps: NonNegative | AdafactorEps | None = None
    amsgrad: bool | None = None
    decoupled_weight_decay: bool | None = None
    decouple: bool | None = None  # prodigy's (prodigyopt's name): AdamW-style decay, else L2 in the gradient
    eps_root: NonNegative | None = None
    amsgrad_variant: Literal["torch", "optax", "optax_raw"] | None = None
    alpha: NonNegative | None = None  # rmsprop's smoothing constant (checked in [0, 1]) or AdEMAMix's mix
    centered: bool | None = None
    eps_in_sqrt: bool | None = None
    lr_decay: NonNegative | None = None
    initial_accumulator_value: NonNegative | None = None
    momentum_decay: NonNegative | None = None
    momentum_schedule: bool | None = None
    beta2_decay: FloatIn(None, 0.0) | None = None
    d: FloatIn(1.0) | None = None
    ns_coefficients: tuple[float, float, float] | None = None
    ns_steps: IntIn(0, 99) | None = None
    adjust_lr_fn: Literal["original", "match_rms_adamw"] | None = None
    ns_dtype: Literal["bfloat16", "float32", "float64"] | None = None
    eps_hat: bool | None = None
    warmup_steps: IntIn(0) | None = None
    r: NonNegative | None = None
    weight_lr_power: NonNegative | None = None
    beta3: UnitHalfOpen | None = None
    beta3_warmup: IntIn(0) | None = None
    alpha_warmup: IntIn(0) | None = None
    cautious: bool | None = None
    cautious_weight_decay: bool | None = None
    d0: Positive | None = None
    d_coef: Positive | None = None
    growth_rate: GrowthRate | None = None
    use_bias_correction: bool | None = None
    safeguard_warmup: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _tuples(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for key in ("eps", "ns_coefficients"):
                if key in data:
                    data[key] = _eps(data[key])
        return data

    def overrides(self) -> dict[str, Any]:
        """The hyper-parameters this table sets (not None)."""
        return {k: getattr(self, k) for k in HYPERPARAMETERS if getattr(self, k) is not None}


class GroupSpec(_Hyper):
    """One parameter group: glob patterns over parameter names plus the fields it overrides."""

    params: list[str] = Field(min_length=1)


class OptimizerSpec(_Hyper):
    """An optimizer (torch.optim vocabulary and defaults), its parameter groups and, for muon, the
    optimizer of the parameters Muon does not update."""

    name: OptimizerName = "adamw"
    groups: list[GroupSpec] = Field(default_factory=list)
    no_weight_decay: list[str] | None = None
    fallback_params: list[str] | None = None
    fallback: "OptimizerSpec | None" = None

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        # Per-optimizer defaults are filled here so that dump_config writes the values in force.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        name = data.get("name", "adamw")
        if not isinstance(name, str) or name not in DEFAULTS:
            return data
        if name == "prodigy" and isinstance(data.get("betas"), (list, tuple)) and len(data["betas"]) == 2:
            data.setdefault("beta3", math.sqrt(data["betas"][1]))  # prodigyopt's beta3 = None
        for key, value in DEFAULTS[name].items():
            data.setdefault(key, value)
        if name == "muon":
            data.setdefault("fallback", {"name": "adamw"})
            data.setdefault("fallback_params", [])
        return data

    @model_validator(mode="after")
    def _check(self) -> "OptimizerSpec":
        own = DEFAULTS[self.name]
        for key in HYPERPARAMETERS:
            value = getattr(self, key)
            if value is not None and key not in own:
                raise field_error(key, _unused(key, value, self.name))
        for key in ("fallback", "fallback_params"):
            if getattr(self, key) is not None and self.name != "muon":
                raise field_error(key, f"is only used when name is muon; received it with name = {self.name!r}")
        check_hyperparameters(self.name, self.overrides(), "")
        if self.fallback is not None:
            fb = self.fallback
            if fb.name in ("muon", "prodigy"):
                raise field_error("fallback.name", f"must not be {fb.name} (the fallback updates the parameters "
                                                   "Muon cannot: non-matrix ones, with an optimizer of its own)")
            for key in ("groups", "no_weight_decay"):
                if getattr(fb, key):
                    raise field_error(f"fallback.{key}", "is not allowed in the fallback; set it on "
                                                         "[optimizer] (it applies to both optimizers)")
        readers = self.group_optimizers()
        for i, group in enumerate(self.groups):
            if self.name == "prodigy":
                _check_prodigy_group(group, i, self.lr)
            for key, value in group.overrides().items():
                users = [n for n in readers if key in DEFAULTS[n]]
                if not users:
                    raise field_error(f"groups[{i}].{key}", _unused(key, value, " / ".join(readers)))
                for n in users:
                    check_hyperparameters(n, {**self.base(n), **group.overrides()}, f"groups[{i}].", key)
        for key in ("no_weight_decay", "fallback_params"):
            patterns = getattr(self, key)
            if patterns is not None and any(not p for p in patterns):
                raise field_error(key, "patterns must be non-empty glob strings")
        return self

    def group_optimizers(self) -> tuple[str, ...]:
        """The optimizers a group's overrides may address: this one and, for muon, the fallback."""
        if self.name == "muon" and self.fallback is not None:
            return ("muon", self.fallback.name)
        return (self.name,)

    def base(self, optimizer: str) -> dict[str, Any]:
        """Top-level hyper-parameters of `optimizer` (this one, or muon's fallback)."""
        if optimizer == self.name:
            return self.overrides()
        if self.fallback is not None and optimizer == self.fallback.name:
            return self.fallback.overrides()
        raise KeyError(optimizer)


def _check_prodigy_group(group: "GroupSpec", i: int, lr: float | None) -> None:
    # prodigyopt reads betas, d0, d_coef, ... from its first group and its one d serves every group
    for key, value in group.overrides().items():
        if key not in PRODIGY_GROUP_FIELDS:
            raise field_error(f"groups[{i}].{key}", f"cannot differ between prodigy's groups (prodigyopt reads it from "
                                                    f"the first group; a group may set {', '.join(PRODIGY_GROUP_FIELDS)}); "
                                                    f"set it on [optimizer]")
    if group.lr is not None and group.lr not in (lr, 0.0):
        raise field_error(f"groups[{i}].lr", f"must equal optimizer.lr = {lr} or be 0 for prodigy (one d estimate "
                                             f"scales every group, prodigyopt refuses other lrs); received {group.lr}")


def _unused(key: str, value: Any, name: str) -> str:
    users = ", ".join(USED_BY.get(key, ())) or "no optimizer"
    if key == "decoupled_weight_decay" and name == "prodigy":
        return (f"is not used with name = 'prodigy': its field is prodigyopt's `decouple` (true: AdamW-style decay, "
                f"the default); received {value!r}")
    if key == "decoupled_weight_decay" and name in ALWAYS_DECOUPLED:
        return (f"is not used with name = {name!r}: its weight decay is always decoupled, p ← p·(1 − lr·wd) "
                f"before the step (the field exists for {users}); received {value!r}")
    return f"is only used when name is {users}; received {value!r} with name = {name!r}"


def check_hyperparameters(name: str, hp: dict[str, Any], where: str, only: str | None = None) -> None:
    """torch's constructor checks that involve several fields (raised against `where + field`)."""

    def fail(key: str, message: str) -> None:
        if only is None or key == only or only in message:
            raise field_error(f"{where}{key}", message)

    eps = hp.get("eps")
    if name == "adafactor" and eps is not None and not isinstance(eps, tuple):
        fail("eps", f"must be torch's pair [eps1, eps2] for adafactor (eps1 = \"auto\" is torch's None: "
                    f"the dtype's machine epsilon); received {eps!r}")
    if name != "adafactor" and isinstance(eps, tuple):
        fail("eps", f"must be a number for {name} (a pair is adafactor's); received {list(eps)!r}")
    if name == "sgd" and hp.get("nesterov"):
        if not hp.get("momentum", 0.0) > 0 or hp.get("dampening", 0.0) != 0:
            fail("nesterov", "needs momentum > 0 and dampening = 0 (torch.optim.SGD); received momentum = "
                             f"{hp.get('momentum')}, dampening = {hp.get('dampening')}")
    if name in ("adam", "adamw") and hp.get("amsgrad_variant", "torch") != "torch" and not hp.get("amsgrad"):
        fail("amsgrad_variant", f"is only used with amsgrad = true; received {hp['amsgrad_variant']!r}")
    if hp.get("eps_hat") and hp.get("eps_root", 0.0) != 0:
        fail("eps_hat", f"cannot be combined with eps_root = {hp['eps_root']} (two eps placements: eps_hat adds "
                        f"eps to the raw sqrt(v), eps_root puts a term inside the root); set one of them")
    if hp.get("eps_hat") and hp.get("amsgrad") and hp.get("amsgrad_variant", "torch") != "torch":
        fail("eps_hat", f"is only defined with amsgrad_variant = 'torch' (Keras's AMSGrad keeps the max of the raw "
                        f"v); received amsgrad_variant = {hp['amsgrad_variant']!r}")
    if name == "schedule_free_adamw" and hp.get("betas", _BETAS)[0] <= 0:
        fail("betas", f"betas[0] must be > 0 for schedule_free_adamw (the evaluation point x = (y − (1 − β1)·z)/β1, "
                      f"schedulefree's eval()); received {list(hp['betas'])}")
    if name == "schedule_free_sgd" and not 0.0 < hp.get("momentum", 0.9) < 1.0:
        fail("momentum", f"must be in (0, 1) for schedule_free_sgd (schedulefree.SGDScheduleFree); "
                         f"received {hp['momentum']}")
    if hp.get("cautious_weight_decay") and name not in ALWAYS_DECOUPLED and not hp.get("decoupled_weight_decay"):
        fail("cautious_weight_decay", f"needs decoupled_weight_decay = true for {name} (it masks the decoupled decay "
                                      f"p·(1 − lr·wd); torch's L2 decay enters the gradient instead)")
    if name == "prodigy" and hp.get("eps", 1.0) <= 0:
        fail("eps", f"must be > 0 for prodigy (prodigyopt refuses 0: a group whose lr is 0 would divide 0 by 0); "
                    f"received {hp['eps']}")
    if name == "rmsprop" and "alpha" in hp and not 0.0 <= hp["alpha"] <= 1.0:
        fail("alpha", f"must be in [0, 1] for rmsprop (the smoothing constant of the squared average); "
                      f"received {hp['alpha']}")
    if name == "nadam" and not hp.get("momentum_schedule", True) and hp.get("momentum_decay") != DEFAULTS["nadam"]["momentum_decay"]:
        fail("momentum_decay", "is not used with momentum_schedule = false (constant beta1, optax.nadam); "
                               "leave it at its default")
