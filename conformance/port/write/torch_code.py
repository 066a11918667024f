"""A config as a runnable PyTorch snippet: torch.optim + lr_scheduler + one training update.

The snippet imports only torch (and math, fnmatch, typing). The optimizer classes torch.optim lacks
are ref_torch's own, carried verbatim (torch_parts). `Updater(model)` builds the optimizer
(twinstep's parameter groups from the name patterns), the scheduler and, with dynamic loss
scaling, a torch.amp.GradScaler; `updater(window, loss_fn)` runs one update exactly as the spec says:
accumulate over the micro-batches, unscale before clipping, skip a non-finite update (parameters,
optimizer state and, by default, the schedule held), step the scheduler after optimizer.step().
"""

from __future__ import annotations

from typing import Any

from conformance.config import Config
from conformance.config.optimizer import SCHEDULE_FREE
from conformance.errors import UnsupportedError
from conformance.port.write import torch_parts as parts
from conformance.port.write.common import block, check_writable, header, layout, layout_code, lit
from conformance.port.write.schedule_code import torch_helpers, torch_scheduler_code

CLASSES = {"sgd": "torch.optim.SGD", "adam": "torch.optim.Adam", "adamw": "torch.optim.AdamW",
           "rmsprop": "torch.optim.RMSprop", "adagrad": "torch.optim.Adagrad", "adamax": "torch.optim.Adamax",
           "nadam": "torch.optim.NAdam", "radam": "torch.optim.RAdam", "adafactor": "torch.optim.Adafactor",
           "muon": "torch.optim.Muon", "lion": "Lion", "schedule_free_adamw": "schedulefree.AdamWScheduleFree",
           "schedule_free_sgd": "schedulefree.SGDScheduleFree", "ademamix": "AdEMAMix", "prodigy": "Prodigy"}
OWN = {"eps_root", "amsgrad_variant", "eps_in_sqrt", "momentum_schedule", "ns_dtype", "eps_hat",
       "decoupled_weight_decay"}  # twinstep-only fields (or not torch's for every class)
NATIVE_DECOUPLED = ("adam", "nadam", "radam")  # torch classes that take decoupled_weight_decay
# ref_torch's torch classes with AdamW's decoupled decay added (p <- p*(1 - lr*wd) before the step)
DECOUPLED = {"sgd": "DecoupledSGD", "rmsprop": "DecoupledRMSprop", "adagrad": "DecoupledAdagrad",
             "adamax": "DecoupledAdamax"}
TWIN_OPTIONS = ("AdamVariants", "RMSpropEpsInSqrt", "AdagradEpsInSqrt")  # ref_torch classes reading OWN's options
NADAM_SCHEDULE_OFF = 1e9  # 0.96 ** (t * 1e9) underflows to 0: torch's mu_t is exactly beta1


def _class_for(name: str, groups: list[dict[str, Any]]) -> str:
    """The class for the groups of one optimizer: torch.optim's, or ref_torch's own where torch has
    none for the spec's semantics (the choice ref_torch._assembly.optimizer_class makes)."""
    if name == "lion":
        return "Lion"
    if name in ("adamax", "nadam") and any(g["eps_hat"] for g in groups):
        raise UnsupportedError(f"to_code: {name} with eps_hat (Keras's eps placement) has no torch.optim class and "
                               f"is not written out; use the twinstep torch backend (ref_torch) for it")
    if name in ("adam", "adamw") and any(g["eps_root"] or g["eps_hat"] or (g["amsgrad"] and g["amsgrad_variant"] != "torch")
                                         for g in groups):
        return "AdamVariants"
    if name == "rmsprop" and any(g["eps_in_sqrt"] for g in groups):
        return "RMSpropEpsInSqrt"
    if name == "adagrad" and any(g["eps_in_sqrt"] for g in groups):
        return "AdagradEpsInSqrt"
    if name == "muon" and any(g["ns_dtype"] != "bfloat16" for g in groups):
        return "FloatMuon"
    if name in DECOUPLED and any(g.get("decoupled_weight_decay") for g in groups):
        return DECOUPLED[name]
    return CLASSES[name]


def _torch_hyper(name: str, hp: dict[str, Any], cls: str) -> dict[str, Any]:
    """A group's hyper-parameters as constructor arguments of `cls`."""
    out = dict(hp)
    if name == "nadam" and not out.pop("momentum_schedule"):
        out["momentum_decay"] = NADAM_SCHEDULE_OFF
    if name == "adafactor":
        out["eps"] = tuple(None if e == "auto" else e for e in out["eps"])
    if name == "adamw":
        out["decoupled_weight_decay"] = True  # what torch.optim.AdamW sets; AdamVariants reads it
    if "betas" in out:
        out["betas"] = tuple(out["betas"])
    if "ns_coefficients" in out:
        out["ns_coefficients"] = tuple(out["ns_coefficients"])
    keep = {"decoupled_weight_decay"} if name in NATIVE_DECOUPLED or cls in DECOUPLED.values() else set()
    if cls in TWIN_OPTIONS:
        keep = {"eps_root", "amsgrad_variant", "eps_in_sqrt", "eps_hat", "decoupled_weight_decay"}
    return {k: v for k, v in out.items() if k not in OWN or k in keep}


def optimizer_code(config: Config) -> tuple[str, list[str]]:
    """(the body of build_optimizer, the ref_torch classes and functions it uses)."""
    entries = layout(config)
    twin: list[str] = []
    classes: dict[str, str] = {}
    for name in dict.fromkeys(e["optimizer"] for e in entries):
        classes[name] = _class_for(name, [e["hyper"] for e in entries if e["optimizer"] == name])
    rows = []
    for e in entries:
        hyper = _torch_hyper(e["optimizer"], e["hyper"], classes[e["optimizer"]])
        if config.optimizer.name == "muon":
            hyper["use_muon"] = not e["fallback"]
        rows.append(f"    {lit(hyper)},")
    lines = ["HYPER = [  # each group's hyper-parameters, in LAYOUT order", *rows, "]", "", "",
             "def param_groups(named_parameters):",
             '    """torch param groups in twinstep\'s layout (zero-size parameters are left out)."""',
             '    groups = [{"params": [], **hyper} for hyper in HYPER]',
             "    for name, p in named_parameters:",
             "        if p.numel() > 0:",
             '            groups[group_index(name, p.ndim)]["params"].append(p)',
             "    return groups", "", ""]
    twin += [c for c in dict.fromkeys(classes.values()) if not c.startswith(("torch.", "schedulefree."))]
    lines += _build_function(config, classes, twin)
    return "\n".join(lines), twin


def _build_function(config: Config, classes: dict[str, str], twin: list[str]) -> list[str]:
    body = _build_body(config, classes, twin)
    if any(e["hyper"].get("cautious_weight_decay") for e in layout(config)):
        twin.append("cautious_weight_decay")
        body.insert(-1, "    cautious_weight_decay(optimizer)  # the decay only where the step moves p toward zero")
    return body


def _build_body(config: Config, classes: dict[str, str], twin: list[str]) -> list[str]:
    name = config.optimizer.name
    body = ["def build_optimizer(named_parameters):", '    """The optimizer of the spec."""']
    if name == "muon":
        fb = config.optimizer.fallback.name  # type: ignore[union-attr]
        if fb == "nadam" or fb == "adagrad":
            raise UnsupportedError(f"to_code: muon with a {fb} fallback is not written out; use adamw, adam or sgd")
        muon = classes["muon"]
        if muon == "FloatMuon":
            body.insert(0, f"NS_DTYPE = torch.{config.optimizer.ns_dtype}  # Newton-Schulz's dtype\n\n")
            body += ["", "    def muon(groups):", "        return FloatMuon(groups, ns_dtype=NS_DTYPE)", ""]
            muon = "muon"
        body.append(f"    optimizer = MuonWithFallback(param_groups(named_parameters), {muon}, {classes[fb]})")
        twin.append("MuonWithFallback")
        return body + ["    return optimizer"]
    cls = classes[name]
    if cls in ("torch.optim.Adagrad", "DecoupledAdagrad"):
        # torch fills every accumulator with the constructor's value; the spec with each group's
        init = config.optimizer.initial_accumulator_value
        body += [f"    optimizer = {cls}(param_groups(named_parameters), initial_accumulator_value={lit(init)})",
                 "    for group in optimizer.param_groups:  # the spec starts each group from its own value",
                 "        for p in group[\"params\"]:",
                 "            optimizer.state[p][\"sum\"].fill_(group[\"initial_accumulator_value\"])"]
    else:
        body.append(f"    optimizer = {cls}(param_groups(named_parameters))")
    if cls.startswith("schedulefree."):
        body.append("    optimizer.train()  # schedulefree: the parameters are the gradient point y in training; "
                    "call optimizer.eval() before evaluating or saving (x), train() after")
    if cls == "torch.optim.NAdam":
        twin.append("_float64_mu_product")
        body.append("    optimizer.register_step_pre_hook(_float64_mu_product)  # float64 mu_product for float64")
    return body + ["    return optimizer"]


def _clip_code(config: Config, norm: str = "norm") -> list[str]:
    # the rule on `grads` (and the parameters' .grad); `norm`: their total norm before clipping
    c = config.clip
    if c.mode == "none":
        return []
    value = [] if c.clip_value is None else [f"torch.nn.utils.clip_grad_value_(self.params, {lit(c.clip_value)})"]
    if c.mode == "value":
        return value
    err = f", error_if_nonfinite={c.error_if_nonfinite}" if c.error_if_nonfinite else ""
    if c.mode == "per_parameter":
        if c.eps == 1e-6:
            return [*value, "for p in self.params:  # every parameter clipped on its own",
                    f"    torch.nn.utils.clip_grad_norm_([p], {lit(c.max_norm)}, {lit(c.norm_type)}{err})"]
        return [*value, "for g in grads:  # every parameter clipped on its own",
                f"    clip_by_norm([g], torch.nn.utils.get_total_norm([g], {lit(c.norm_type)}))"]
    if value:  # clamped first: the norm rule takes the clamped gradients' norm, not the logged one
        if c.eps == 1e-6:
            return [*value, f"torch.nn.utils.clip_grad_norm_(self.params, {lit(c.max_norm)}, {lit(c.norm_type)}{err})"]
        return [*value, f"clip_by_norm(grads, torch.nn.utils.get_total_norm(grads, {lit(c.norm_type)}))"]
    if c.eps == 1e-6:
        return [f"torch.nn.utils.clip_grads_with_norm_(self.params, {lit(c.max_norm)}, {norm})"]
    return [f"clip_by_norm(grads, {norm})"]


def _step_clip_code(config: Config) -> list[str]:
    """clip.target = "updates": the step taken, Δ = p' − p, handed to the clipping rule as the
    parameters' .grad (the gradients are spent), and p ← p + clip(Δ) (optax's clip after adam)."""
    return ["with torch.no_grad():  # clip.target = \"updates\": clip the step taken, not the gradients",
            "    for q, b in zip(self.params, before):",
            "        q.grad = q - b",
            "    grads = [q.grad for q in self.params]",
            *("    " + line for line in _clip_code(config, "torch.nn.utils.get_total_norm(grads, NORM_TYPE)")),
            "    for q, b in zip(self.params, before):",
            "        q.copy_(b + q.grad)"]


def _clip_helper(config: Config) -> str:
    c = config.clip
    if c.mode not in ("global_norm", "per_parameter") or c.eps == 1e-6:
        return ""
    if c.eps == 0:
        return block(f'''
            def clip_by_norm(grads, norm, max_norm={lit(c.max_norm)}):
                """optax.clip_by_global_norm's rule (clip.eps = 0): untouched below max_norm, else g / n * c."""
                if norm >= max_norm:
                    for g in grads:
                        g.mul_(1.0 / norm).mul_(max_norm)
            ''')
    return block(f'''
        def clip_by_norm(grads, norm, max_norm={lit(c.max_norm)}, eps={lit(c.eps)}):
            """clip_grad_norm_'s rule with the spec's eps: g * min(max_norm / (n + eps), 1)."""
            coef = torch.clamp(max_norm / (norm + eps), max=1.0)
            for g in grads:
                g.mul_(coef)
        ''')


def torch_code(config: Config, source: str = "", updates_per_epoch: int = 1) -> str:
    """The whole snippet for `config` (see the module docstring)."""
    check_writable(config, "torch")
    opt_body, twin = optimizer_code(config)
    extra = parts.carried(twin)
    sched = block(torch_scheduler_code(config.schedule), 4)
    lines = parts.import_lines({"lr_scheduler": ("torch.optim", "lr_scheduler"), **extra.imports})
    outside = [line for line in lines if not line.startswith(("import torch", "from torch"))]
    imports = "\n".join(["import fnmatch", "import math", *(["import warnings"] if config.schedule.hyper else []),
                         *outside, ""] + (
        ["import schedulefree"] if config.optimizer.name in SCHEDULE_FREE else []) + ["import torch"] + [
        line for line in lines if line not in outside])
    pieces = [header(config, "torch", source), imports, layout_code(config)]
    pieces += extra.sources
    helpers = [torch_helpers(config.schedule), *(torch_helpers(p) for p in (config.schedule.hyper or {}).values())]
    pieces += [opt_body, *dict.fromkeys(h for h in helpers if h), 'def build_scheduler(optimizer):\n    """The lr schedule: step it after '
               'optimizer.step(), once per update."""\n' + sched]
    if config.schedule.unit == "epoch":
        pieces.append(block(f'''
            UPDATES_PER_EPOCH = {updates_per_epoch}


            class PerEpoch:
                """unit = "epoch": the schedule steps once every UPDATES_PER_EPOCH (applied) updates."""

                def __init__(self, scheduler, n=UPDATES_PER_EPOCH):
                    self.scheduler, self.n, self.count = scheduler, n, 0

                def step(self):
                    self.count += 1
                    if self.count % self.n == 0:
                        self.scheduler.step()
            '''))
    pieces += _hyper_code(config.schedule)
    helper = _clip_helper(config)
    if helper:
        pieces.append(helper)
    from conformance.port.write.torch_step import updater_code

    if config.clip.target == "updates":
        pieces.append(updater_code(config, [], _step_clip_code(config)))
    else:
        pieces.append(updater_code(config, _clip_code(config)))
    return "\n\n\n".join(p for p in pieces if p) + "\n"


def _hyper_code(schedule: Any) -> list[str]:
    """[schedule.hyper]: a build function per key and the object that writes the values into the groups."""
    if not schedule.hyper:
        return []
    out = [f'def build_hyper_{key}(optimizer):\n    """[schedule.hyper.{key}]: built on a stand-in optimizer '
           f'whose lrs carry the values."""\n' + block(torch_scheduler_code(spec), 4)
           for key, spec in schedule.hyper.items()]
    wrap = "PerEpoch(build(stand_in))" if schedule.unit == "epoch" else "build(stand_in)"
    builds = ", ".join(f'"{key}": build_hyper_{key}' for key in schedule.hyper)
    out.append(block(f'''
        class ScheduledHyperparameters:
            """Hyper-parameters other than the lr on schedules of their own (lr_scheduler moves only
            the lr): each key's values ride on a stand-in optimizer's lrs, moved by its scheduler, and
            are written into every param group that reads the key; step it with the lr's scheduler."""

            BUILD = {{{builds}}}

            def __init__(self, optimizer):
                self.optimizer, self.parts = optimizer, []
                for key, build in self.BUILD.items():
                    values = [self.read(key, group) for group in optimizer.param_groups]
                    stand_in = torch.optim.SGD([{{"params": [torch.zeros(1)], "lr": 0.0 if v is None else v}}
                                                for v in values])
                    self.parts.append((key, stand_in, {wrap}, [v is not None for v in values]))
                self.write()

            @staticmethod
            def read(key, group):
                if key in ("beta1", "beta2"):  # betas[0] / betas[1]
                    return group["betas"][0 if key == "beta1" else 1] if "betas" in group else None
                return group.get(key)

            def step(self):
                with warnings.catch_warnings():  # a stand-in optimizer never steps: its scheduler carries values
                    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\\.step\\(\\)`")
                    for _, _, scheduler, _ in self.parts:
                        scheduler.step()
                self.write()

            def write(self):
                for key, stand_in, _, reads in self.parts:
                    for group, shadow, read in zip(self.optimizer.param_groups, stand_in.param_groups, reads):
                        if read and key in ("beta1", "beta2"):
                            betas = list(group["betas"])
                            betas[0 if key == "beta1" else 1] = shadow["lr"]
                            group["betas"] = tuple(betas)
                        elif read:
                            group[key] = shadow["lr"]
        '''))
    return out
