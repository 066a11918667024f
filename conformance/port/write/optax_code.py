"""A config as a runnable JAX/Optax snippet: an optax chain and a step function.

The snippet imports only jax, optax (and math, fnmatch). Parameters are a flat {name: array} dict
keyed by the neutral names (flatten a Flax tree with "." joins). `TX` is the chain: clipping, then
one chain per parameter group (optax.multi_transform over twinstep's layout), wrapped in
optax.inject_hyperparams so that the schedule's lr (and OneCycle's momentum) are set before every
update from the schedule position, which holds on skipped updates as the spec says. Where optax's
own math differs from the spec, the custom transform is written out (code_optax_parts).
"""

from __future__ import annotations

from typing import Any

from conformance.config import Config
from conformance.errors import UnsupportedError
from conformance.port.write import optax_parts as parts
from conformance.port.write.common import block, check_writable, header, layout, layout_code, lit
from conformance.port.write.schedule_code import (
    helpers,
    momentum_schedule,
    optax_schedule,
)
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import cycled_hyperparameter, hyper_bases, start_lrs


def _group_chain(entry: dict[str, Any], i: int, cycled: str | None, need: list[str],
                 scheduled: frozenset[str] = frozenset()) -> str:
    """The optax chain of one parameter group (hyper-parameter `lr_i`, `momentum_i` if cycled, and
    `<key>_i` for each [schedule.hyper] key in `scheduled`)."""
    name, hp = entry["optimizer"], entry["hyper"]
    lr = f"lr_{i}"
    out: list[str] = []
    if scheduled and name in ("schedule_free_adamw", "schedule_free_sgd"):
        raise UnsupportedError(f"to_code: schedule.hyper with {name} (refused by the spec's rules)")
    if "momentum" in scheduled:
        cycled = "momentum"  # fed `momentum_i` every update, as a cycled momentum is
    if "beta1" in scheduled:
        cycled = "beta1"

    def use(*texts: str) -> None:
        need.extend(t for t in texts if t not in need)

    def val(key: str) -> str:  # a [schedule.hyper] key is fed as `<key>_i` every update
        return f"{key}_{i}" if key in scheduled else lit(hp[key])

    if name in ("schedule_free_adamw", "schedule_free_sgd"):
        return _schedule_free(name, hp, i, cycled, use)
    if name == "prodigy":
        use(parts.PRODIGY)
        return (f"prodigyopt_prodigy({lr}, betas=({lit(hp['betas'][0])}, {lit(hp['betas'][1])}), "
                f"beta3={lit(hp['beta3'])}, eps={lit(hp['eps'])}, weight_decay={lit(hp['weight_decay'])},\n"
                f"            decouple={hp['decouple']}, use_bias_correction={hp['use_bias_correction']}, "
                f"safeguard_warmup={hp['safeguard_warmup']}, d0={lit(hp['d0'])}, d_coef={lit(hp['d_coef'])}, "
                f"growth_rate={lit(hp['growth_rate'])})")
    if hp.get("eps_hat") and (name not in ("adam", "adamw") or (hp["amsgrad"] and hp["amsgrad_variant"] != "torch")):
        raise UnsupportedError(f"to_code: {name} with eps_hat (Keras's eps placement) is not written out for optax; "
                               f"use twinstep's JAX backend (ref_jax) for it")
    if hp.get("maximize"):
        out.append("optax.scale(-1.0)")  # torch negates the gradient before the weight decay
    decays = bool(hp.get("weight_decay", 0.0)) or "weight_decay" in scheduled
    wd = f"weight_decay_{i}" if "weight_decay" in scheduled else lit(hp.get("weight_decay", 0.0))
    decoupled = name in ("adamw", "lion", "ademamix") or bool(hp.get("decoupled_weight_decay"))
    if decays and not decoupled and name not in ("adafactor", "muon"):
        out.append(f"optax.add_decayed_weights({wd})")  # coupled (L2): before the moments
    b1 = f"momentum_{i}" if cycled == "beta1" else lit(hp["betas"][0]) if "betas" in hp else None
    b2 = f"beta2_{i}" if "beta2" in scheduled else lit(hp["betas"][1]) if "betas" in hp else None
    if name == "sgd":
        mom = f"momentum_{i}" if cycled == "momentum" else lit(hp["momentum"])
        if cycled or hp["momentum"] > 0:
            if hp["dampening"] == 0:
                out.append(f"optax.trace(decay={mom}, nesterov={hp['nesterov']})")
            else:
                use(parts.COUNT, parts.MOMENTUM)
                out.append(f"torch_momentum({mom}, {val('dampening')}, {hp['nesterov']})")
    elif name in ("adam", "adamw"):
        eps, root = val("eps"), lit(hp["eps_root"])
        variant = hp["amsgrad_variant"] if hp["amsgrad"] else None
        if hp["eps_hat"]:
            use(parts.COUNT, parts.EPS_HAT)
            out.append(f"adam_eps_hat({b1}, {b2}, {eps}, amsgrad={variant is not None})")
        elif variant == "torch":
            use(parts.COUNT, parts.AMSGRAD)
            out.append(f"torch_amsgrad({b1}, {b2}, {eps}, {root})")
        elif variant is not None:
            raw = ", bias_correction_nu=False" if variant == "optax_raw" else ""
            out.append(f"optax.scale_by_amsgrad(b1={b1}, b2={b2}, eps={eps}, eps_root={root}{raw})")
        else:
            out.append(f"optax.scale_by_adam(b1={b1}, b2={b2}, eps={eps}, eps_root={root})")
    elif name == "rmsprop":
        kind = "scale_by_stddev" if hp["centered"] else "scale_by_rms"
        out.append(f"optax.{kind}(decay={val('alpha')}, eps={val('eps')}, eps_in_sqrt={hp['eps_in_sqrt']})")
        if cycled or hp["momentum"] > 0:  # torch's order: the buffer before the lr
            out.append(f"optax.trace(decay={f'momentum_{i}' if cycled else lit(hp['momentum'])})")
    elif name == "adagrad":
        if hp["eps_in_sqrt"]:
            out.append(f"optax.scale_by_rss(initial_accumulator_value={lit(hp['initial_accumulator_value'])}, "
                       f"eps={val('eps')})")
            if hp["lr_decay"]:
                out.append(f"optax.scale_by_schedule(lambda c: 1 / (1 + c * {lit(hp['lr_decay'])}))")
        else:
            use(parts.COUNT, parts.ADAGRAD)
            out.append(f"torch_adagrad({lit(hp['initial_accumulator_value'])}, {val('eps')}, "
                       f"{lit(hp['lr_decay'])})")
    elif name == "adamax":
        out.append(f"optax.scale_by_adamax(b1={b1}, b2={b2}, eps={val('eps')})")
    elif name == "nadam":
        if hp["momentum_schedule"]:
            use(parts.COUNT, parts.NADAM)
            out.append(f"torch_nadam({b1}, {b2}, {val('eps')}, {lit(hp['momentum_decay'])})")
        else:
            out.append(f"optax.scale_by_adam(b1={b1}, b2={b2}, eps={val('eps')}, nesterov=True)")
    elif name == "radam":
        use(parts.COUNT, parts.RADAM)
        out.append(f"torch_radam({b1}, {b2}, {val('eps')})")
    elif name == "lion":
        core = f"optax.scale_by_lion(b1={b1}, b2={b2})"
        if hp["cautious"]:  # the mask reads the gradient the chain received (negated by maximize)
            use(parts.CAUTIOUS)
            core = f"cautious({core})"
        out.append(core)
    elif name == "ademamix":
        b3, alpha = val("beta3"), val("alpha")
        if hp["beta3_warmup"] or hp["alpha_warmup"]:
            use(parts.ADEMAMIX)
        if hp["beta3_warmup"]:
            b3 = f"ademamix_beta3({b1}, {b3}, {hp['beta3_warmup']})"
        if hp["alpha_warmup"]:
            alpha = f"ademamix_alpha({alpha}, {hp['alpha_warmup']})"
        out.append(f"optax.contrib.scale_by_ademamix(b1={b1}, b2={b2}, b3={b3}, alpha={alpha}, eps={val('eps')})")
    elif name == "adafactor":
        use(parts.ADAFACTOR)
        e1, e2 = hp["eps"]
        out.append(f"torch_adafactor({lr}, {lit(hp['beta2_decay'])}, {None if e1 == 'auto' else lit(e1)}, "
                   f"{lit(e2)}, {lit(hp['d'])}, {wd})")
        return "optax.chain(" + ", ".join(out) + ")"
    elif name == "muon":
        use(parts.COUNT, parts.MUON)
        mom = f"momentum_{i}" if cycled == "momentum" else lit(hp["momentum"])
        out.append(f"torch_muon({lr}, {mom}, {hp['nesterov']}, {lit(tuple(hp['ns_coefficients']))}, "
                   f"{hp['ns_steps']}, {val('eps')}, {wd}, {lit(hp['adjust_lr_fn'])}, jnp.{hp['ns_dtype']}"
                   f"{', cautious=True' if hp['cautious_weight_decay'] else ''})")
        return "optax.chain(" + ", ".join(out) + ")"
    if decays and decoupled and hp.get("cautious_weight_decay"):
        use(parts.CAUTIOUS_DECAY)
        out.append(f"cautious_decayed_weights({wd})")  # decoupled, only where u·p >= 0
    elif decays and decoupled:
        out.append(f"optax.add_decayed_weights({wd})")  # decoupled: lr * wd * p
    out.append(f"optax.scale_by_learning_rate({lr})")
    return "optax.chain(\n            " + ",\n            ".join(out) + ",\n        )"


def _schedule_free(name: str, hp: dict[str, Any], i: int, cycled: str | None, use: Any) -> str:
    """optax.contrib.schedule_free around the chain schedulefree's update takes: AdamW's is
    scale_by_rms with bias correction (no first moment), both decay at y, the warm-up inside."""
    if hp["r"]:
        raise UnsupportedError(f"to_code: {name} with r = {hp['r']} (polynomial averaging weights) has no "
                               f"optax.contrib.schedule_free argument; use r = 0 or twinstep's JAX backend")
    use(parts.WARMUP)
    warm = hp["warmup_steps"]
    inner = []
    if name == "schedule_free_adamw":
        inner.append(f"optax.scale_by_rms(decay={lit(hp['betas'][1])}, eps={lit(hp['eps'])}, eps_in_sqrt=False, "
                     f"bias_correction=True)")
        beta = f"momentum_{i}" if cycled == "beta1" else lit(hp["betas"][0])
    else:
        beta = f"momentum_{i}" if cycled == "momentum" else lit(hp["momentum"])
    if hp["weight_decay"]:
        inner.append(f"optax.add_decayed_weights({lit(hp['weight_decay'])})")  # at y, before the lr
    inner.append(f"optax.scale_by_learning_rate(free_lr(lr_{i}, {warm}, ahead=1))")
    return (f"optax.contrib.schedule_free(\n            optax.chain({', '.join(inner)}),\n"
            f"            learning_rate=free_lr(lr_{i}, {warm}), b1={beta}, "
            f"weight_lr_power={lit(hp['weight_lr_power'])})")


def _clip(config: Config, need: list[str]) -> str | None:
    c = config.clip
    if c.mode == "none":
        return None
    if c.mode == "value":
        return f"optax.clip({lit(c.clip_value)})"
    if c.mode == "global_norm" and c.eps == 0 and c.norm_type == 2:
        norm = f"optax.clip_by_global_norm({lit(c.max_norm)})"
    else:
        need.extend(t for t in (parts.NORM, parts.CLIP) if t not in need)
        norm = (f"clip_by_norm_torch({lit(c.max_norm)}, {lit(c.eps)}, {lit(c.norm_type)}, "
                f"per_parameter={c.mode == 'per_parameter'})")
    # clip_value with max_norm: by value first, then the norm rule, as torch's two calls
    return norm if c.clip_value is None else f"optax.chain(optax.clip({lit(c.clip_value)}), {norm})"


def tx_code(config: Config, need: list[str]) -> str:
    """LR_SCHEDULES, the make_tx factory and TX."""
    entries = layout(config)
    if config.optimizer.name == "prodigy" and len(entries) > 1:
        raise UnsupportedError("to_code: prodigy with several parameter groups (groups or no_weight_decay) is not "
                               "written out for optax: one d spans every group; use twinstep's JAX backend (ref_jax)")
    cycled = cycled_hyperparameter(config.schedule, config.optimizer)
    used: set[str] = set()
    bases = start_lrs(config.schedule, group_base_lrs(config.optimizer))
    scheds = [optax_schedule(config.schedule, used, lit(b)) for b in bases]
    lines = ["LR_SCHEDULES = [  # one per group: the lr at a (float) schedule step",
             *(f"    {s}," for s in scheds), "]"]
    if cycled:
        lines.append(f"MOMENTUM_SCHEDULE = {momentum_schedule(config.schedule, used)}  # OneCycle's {cycled}")
    hyper = _hyper_names(config, used)
    if hyper:
        lines += ["HYPER_SCHEDULES = {  # [schedule.hyper]: each group's value at a (float) schedule step",
                  *(f"    {n!r}: {fn}," for n, fn in hyper.items()), "}"]
    scheduled = [frozenset(k for k, bases in hyper_bases(config.schedule, config.optimizer).items()
                           if bases[i] is not None) for i in range(len(entries))]
    chains = [_group_chain(e, i, cycled, need, scheduled[i]) for i, e in enumerate(entries)]
    clip = _clip(config, need)
    names = [f"lr_{i}" for i in range(len(entries))] + ([f"momentum_{i}" for i in range(len(entries))]
                                                        if cycled else []) + list(hyper)
    args = ", ".join(names)
    if len(entries) == 1:
        inner = "\n".join(line[4:] if i else line for i, line in enumerate(chains[0].split("\n")))
    else:
        body = "".join(f'        "g{i}": {c},\n' for i, c in enumerate(chains))
        inner = "optax.multi_transform({\n" + body + "    }, param_labels)"
    whole = inner if not clip else (f"optax.chain({inner}, {clip})" if config.clip.target == "updates"
                                    else f"optax.chain({clip}, {inner})")  # "updates": the clip sees the updates
    tx = (f"def make_tx({args}):\n    \"\"\"The whole chain; inject_hyperparams feeds it the values of every update.\"\"\"\n"
          f"    return {whole}\n\n\n"
          f"TX = optax.inject_hyperparams(make_tx)(**{{n: jnp.asarray(0.0, PARAM_DTYPE) for n in {names!r}}})")
    labels = block('''
        def param_labels(params):
            """Each parameter's group label ("g0", "g1", ...) in twinstep's layout."""
            return {name: f"g{group_index(name, p.ndim)}" for name, p in params.items()}
        ''')
    return "\n\n\n".join(filter(None, [helpers(used), "\n".join(lines), labels, tx]))


def _hyper_names(config: Config, used: set[str]) -> dict[str, str]:
    """[schedule.hyper]'s injected names (`<key>_i`; beta1 and momentum as `momentum_i`, the name a
    cycled one has) and each one's optax schedule from the group's own value."""
    out = {}
    for key, bases in hyper_bases(config.schedule, config.optimizer).items():
        for i, base in enumerate(bases):
            if base is not None:
                name = f"momentum_{i}" if key in ("momentum", "beta1") else f"{key}_{i}"
                out[name] = optax_schedule(config.schedule.hyper[key], used, lit(base))  # type: ignore[index]
    return out


IMPORTS = "import fnmatch\nimport math\nfrom typing import NamedTuple\n\nimport jax\nimport jax.numpy as jnp\nimport optax"


def optax_code(config: Config, source: str = "", updates_per_epoch: int = 1) -> str:
    """The whole snippet for `config` (see the module docstring)."""
    from conformance.port.write.optax_step import step_code

    check_writable(config, "optax")

    need: list[str] = []
    p = config.precision
    x64 = ('if not jax.config.jax_enable_x64:  # a float64 spec: JAX needs 64-bit types\n'
           '    jax.config.update("jax_enable_x64", True)' if p.param_dtype == "float64" else "")
    upe = updates_per_epoch if config.schedule.unit == "epoch" else 1
    consts = "\n".join(filter(None, [x64, f"PARAM_DTYPE = jnp.{p.param_dtype}",
                                     f"COMPUTE_DTYPE = jnp.{p.compute_dtype}", f"UPDATES_PER_EPOCH = {upe}"]))
    tx = tx_code(config, need)
    pieces = [header(config, "optax", source),
              IMPORTS,
              consts, layout_code(config), *(t.strip("\n") for t in need), tx, step_code(config)]
    return "\n\n\n".join(pieces) + "\n"
