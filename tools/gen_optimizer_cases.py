"""Write optimizer conformance cases whose expected values come from the frameworks' built-ins.

    python tools/gen_optimizer_cases.py                       # the bundled cases (conformance/cases/optimizer)
    python tools/gen_optimizer_cases.py --random 200 --seed 7 --out /tmp/opt-cases
    twinstep conform --cases /tmp/opt-cases

Expected parameters and states come from torch.optim in float64 (torch.set_default_dtype(float64),
so that NAdam's mu_product is float64 too) and, where torch has no built-in, from optax in float64
(jax x64): Lion (optax.lion, equal to lucidrains/lion-pytorch) and optax's semantics (eps_root,
optax.amsgrad, optax.adagrad, optax.rmsprop with eps inside the square root, optax.nadam); from
schedulefree's AdamWScheduleFree / SGDScheduleFree in train mode; these references are in
tools/_optimizer_refs.py. Keras's semantics (decoupled decay on every optimizer, eps_hat, eps inside
the root) come from Keras 3 on its JAX backend in float64 and from the goldens of Keras's own
tests (tools/_keras_refs.py). Nothing here imports ref_torch, ref_jax or the oracle:
the spec -> torch.optim translation is the generator's own, written from torch's constructor
signatures. Each update's state is recorded under the neutral names of docs/contract.md §4 (`step`
counted per parameter as torch does; for SGD and Muon, which keep no count, by counting the updates
a parameter received). This file holds the case lists and the case file format.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the references beside this script, however it is loaded
from _keras_refs import run_keras  # noqa: E402
from _optimizer_peer_cases import keras_quoted, torch_ema, wave2  # noqa: E402
from _optimizer_refs import (  # noqa: E402
    TORCH,
    run_heavyball,
    run_optax,
    run_prodigyopt,
    run_pytorch_optimizer,
    run_schedulefree,
    run_torch,
)

from conformance import tomlio  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "conformance" / "cases" / "optimizer"


def _arr(x: Any) -> Any:
    return np.asarray(x, np.float64).tolist()


REFERENCES = {"torch": run_torch, "optax": run_optax, "keras": run_keras, "schedulefree": run_schedulefree,
              "pytorch_optimizer": run_pytorch_optimizer, "heavyball": run_heavyball, "prodigyopt": run_prodigyopt}
NAMES = {"torch": "torch.optim", "optax": "optax", "keras": "Keras 3 (JAX backend)",
         "schedulefree": "schedulefree (train mode: the parameters are y)",
         "pytorch_optimizer": "pytorch-optimizer 4.1.0", "heavyball": "heavyball 3.2.1",
         "prodigyopt": "prodigyopt 1.1.2"}


def write_case(path: Path, case_id: str, source: str, spec: dict[str, Any], params: dict[str, Any],
               grads: list[dict] | None = None, objective: dict | None = None, steps: int | None = None,
               reference: str = "torch", with_state: bool = True, quoted: list | None = None,
               tolerance: dict[str, float] | None = None, ema: dict[str, Any] | None = None) -> None:
    """One case file; `quoted` (one {name: values} per update) replaces the reference run (a
    golden table), with its `tolerance`; `ema` (an [ema] table) adds the EMA after each update,
    from torch's AveragedModel over the reference trajectory, or from Keras's use_ema."""
    previous = torch.get_default_dtype()
    try:
        out_p, out_s = (quoted, None) if quoted is not None else REFERENCES[reference](spec, params, grads,
                                                                                          objective, steps)
    finally:
        torch.set_default_dtype(previous)  # torch's float64 reference run must not leak into the caller
    with_state = with_state and out_s is not None
    if ema is not None:
        previous = torch.get_default_dtype()
        try:
            averages = (run_keras(spec, params, grads, objective, steps, ema) if reference == "keras"
                        else torch_ema(ema, params, out_p))
        finally:
            torch.set_default_dtype(previous)
    inputs: dict[str, Any] = {"params": {k: _arr(v) for k, v in params.items()}}
    if grads is not None:
        inputs["grads"] = [{k: _arr(v) for k, v in g.items()} for g in grads]
    else:
        inputs["objective"] = {"kind": "quadratic", **{part: {k: _arr(v) for k, v in objective[part].items()}
                                                       for part in ("center", "curvature")}}
        inputs["steps"] = steps
    expected: dict[str, Any] = {"params": [{k: _arr(v) for k, v in p.items()} for p in out_p]}
    if with_state:
        expected["state"] = [{n: {k: (int(v) if k == "step" else _arr(v)) for k, v in e.items()} for n, e in s.items()}
                             for s in out_s]
    if ema is not None:
        expected["ema"] = [{k: _arr(v) for k, v in e.items()} for e in averages]
    head = tomlio.dumps({"id": case_id, "kind": "optimizer", "source": source, "optimizer": spec,
                         **({"ema": ema} if ema else {}), **({"tolerance": tolerance} if tolerance else {})})
    lines = [head.rstrip(), "", "[inputs]"]
    lines += [f"{_key(k)} = {_inline(v, 0 if k != 'grads' else 1)}" for k, v in inputs.items()]
    lines += ["", "[expected]"] + [f"{_key(k)} = {_inline(v, 1)}" for k, v in expected.items()]
    path.write_text("\n".join(lines) + "\n")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else '"' + k + '"'


def _inline(v: Any, rows: int = 0) -> str:
    """Compact TOML: arrays and tables inline; with rows = 1 a list puts one entry per line."""
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_inline(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        if rows and v and isinstance(v[0], dict):
            return "[\n" + "".join(f"  {_inline(x)},\n" for x in v) + "]"
        return "[" + ", ".join(_inline(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, (int, float)) else '"' + str(v) + '"'


def _rng_params(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    return {k: np.round(rng.uniform(-2, 2, shape), 4) for k, shape in shapes.items()}


def _grads(rng: np.random.Generator, shapes: dict[str, tuple[int, ...]], n: int,
           missing: dict[int, list[str]] | None = None) -> list[dict[str, np.ndarray]]:
    out = [_rng_params(rng, shapes) for _ in range(n)]
    for k, names in (missing or {}).items():
        for name in names:
            del out[k][name]
    return out


OPEN = {"w": (2, 3), "b": (3,)}
NAMED = {"enc.weight": (2, 2), "enc.bias": (2,), "head.weight": (2, 2), "head.bias": (2,)}
QUAD = {"center": {"x": [0.5, 1.0, -1.0]}, "curvature": {"x": [2.0, 0.5, 4.0]}}


def bundled() -> list[dict[str, Any]]:
    """At least three cases per optimizer: open loop (given gradients, one missing), closed loop
    (quadratic objective) and parameter groups; plus optax's semantics from optax."""
    rng = np.random.default_rng(2024)
    cases: list[dict[str, Any]] = []

    def add(case_id: str, spec: dict[str, Any], kind: str, reference: str = "torch", n: int = 4,
            shapes: dict[str, tuple[int, ...]] | None = None, note: str = "", ema: dict | None = None) -> None:
        ref = NAMES[reference]
        source = f"generated by tools/gen_optimizer_cases.py from {ref} in float64: {note or kind}"
        c: dict[str, Any] = {"path": None, "case_id": f"optimizer/{case_id}", "source": source, "spec": spec,
                             "reference": reference, **({"ema": ema} if ema else {})}
        if kind == "objective" and shapes:  # a quadratic over parameters of these shapes
            c.update(params=_rng_params(rng, shapes), steps=n, objective={
                "center": _rng_params(rng, shapes), "curvature": {k: np.abs(v) for k, v in _rng_params(rng, shapes).items()}})
        elif kind == "objective":
            c.update(params={"x": np.array([1.5, -2.0, 0.5])}, objective=QUAD, steps=n)
        else:
            shp = shapes or (NAMED if kind == "groups" else OPEN)
            first = next(iter(shp))
            every = reference in ("keras", "schedulefree") or spec.get("eps_hat")  # no per-parameter counts
            miss = {1: [first]} if reference in ("torch", "prodigyopt") and kind != "groups" and not every else None
            c.update(params=_rng_params(rng, shp), grads=_grads(rng, shp, n, miss))
        cases.append(c)

    add("torch-sgd-open", {"name": "sgd", "lr": 0.1}, "open", note="plain SGD; w has no gradient in update 1")
    add("torch-sgd-closed", {"name": "sgd", "lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
        "objective", n=5, note="momentum with dampening (first buffer = g) and L2 decay")
    add("torch-sgd-groups", {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True,
                             "groups": [{"params": ["head.*"], "lr": 0.02, "momentum": 0.5}]}, "groups",
        note="Nesterov, a group with its own lr and momentum")
    add("torch-sgd-maximize", {"name": "sgd", "lr": 0.05, "momentum": 0.5, "weight_decay": 0.1, "maximize": True},
        "open", note="maximize negates g before the decay")
    add("torch-adam-open", {"name": "adam", "lr": 0.01}, "open", note="defaults; w has no gradient in update 1")
    add("torch-adam-closed", {"name": "adam", "lr": 0.1, "amsgrad": True, "weight_decay": 0.1}, "objective", n=6,
        note="AMSGrad (max of raw v, bias-corrected) with L2 decay")
    add("torch-adam-groups", {"name": "adam", "lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1,
                              "groups": [{"params": ["enc.*"], "betas": [0.8, 0.99], "eps": 1e-3}]}, "groups",
        note="decoupled decay, a group with its own betas and eps")
    add("torch-adam-maximize", {"name": "adam", "lr": 0.01, "maximize": True, "weight_decay": 0.5}, "open")
    add("torch-adamw-open", {"name": "adamw", "lr": 0.01}, "open", note="torch's default weight_decay 1e-2")
    add("torch-adamw-closed", {"name": "adamw", "lr": 0.2, "amsgrad": True, "weight_decay": 0.05}, "objective", n=6)
    add("torch-adamw-groups", {"name": "adamw", "lr": 0.01, "weight_decay": 0.1, "no_weight_decay": ["*.bias"],
                               "groups": [{"params": ["head.*"], "lr": 0.003}]}, "groups",
        note="no weight decay on biases, a head group with its own lr")
    add("torch-rmsprop-open", {"name": "rmsprop"}, "open", note="torch defaults: alpha 0.99, eps outside the sqrt")
    add("torch-rmsprop-closed", {"name": "rmsprop", "lr": 0.05, "centered": True, "momentum": 0.5,
                                 "weight_decay": 0.1}, "objective", n=5)
    add("torch-rmsprop-groups", {"name": "rmsprop", "lr": 0.01, "groups": [{"params": ["enc.*"], "alpha": 0.9,
                                                                           "momentum": 0.9}]}, "groups")
    add("torch-adagrad-open", {"name": "adagrad", "lr": 0.1}, "open", note="eps outside the sqrt, accumulator from 0")
    add("torch-adagrad-closed", {"name": "adagrad", "lr": 0.5, "lr_decay": 0.05, "initial_accumulator_value": 0.2,
                                 "weight_decay": 0.1}, "objective", n=5)
    add("torch-adagrad-groups", {"name": "adagrad", "lr": 0.1, "groups": [{"params": ["head.*"], "lr": 0.3,
                                                                          "eps": 1e-3, "lr_decay": 0.1}]}, "groups")
    add("torch-adamax-open", {"name": "adamax", "lr": 0.02}, "open")
    add("torch-adamax-closed", {"name": "adamax", "lr": 0.2, "weight_decay": 0.1}, "objective", n=5)
    add("torch-adamax-groups", {"name": "adamax", "groups": [{"params": ["head.*"], "betas": [0.5, 0.9]}]}, "groups")
    add("torch-nadam-open", {"name": "nadam", "lr": 0.01}, "open", note="Dozat's momentum schedule")
    add("torch-nadam-closed", {"name": "nadam", "lr": 0.1, "momentum_decay": 0.01, "weight_decay": 0.1},
        "objective", n=6)
    add("torch-nadam-groups", {"name": "nadam", "decoupled_weight_decay": True, "weight_decay": 0.1,
                               "groups": [{"params": ["enc.*"], "momentum_decay": 0.1}]}, "groups")
    add("torch-radam-open", {"name": "radam", "lr": 0.01}, "open", n=8, note="8 updates: the rectified step from t = 6")
    add("torch-radam-closed", {"name": "radam", "lr": 0.1, "decoupled_weight_decay": True, "weight_decay": 0.1},
        "objective", n=9)
    add("torch-radam-groups", {"name": "radam", "groups": [{"params": ["head.*"], "betas": [0.9, 0.9]}]}, "groups",
        n=5, note="beta2 = 0.9 rectifies from t = 3")
    add("torch-adafactor-open", {"name": "adafactor", "lr": 0.05}, "open", shapes={"w": (2, 3), "b": (3,), "k": (2, 2, 3)},
        note="2-D and 3-D parameters factored over the last two axes")
    add("torch-adafactor-closed", {"name": "adafactor", "lr": 0.5, "weight_decay": 0.1, "beta2_decay": -0.5,
                                   "eps": [1e-6, 1e-3], "d": 2.0}, "objective", n=5)
    add("torch-adafactor-groups", {"name": "adafactor", "groups": [{"params": ["enc.*"], "lr": 0.2, "d": 1.5}]},
        "groups")
    muon_shapes = {"w": (3, 2), "v": (2, 4), "b": (4,)}
    add("torch-muon-open", {"name": "muon", "lr": 0.02}, "open", shapes=muon_shapes,
        note="Muon for the 2-D w and v (Newton-Schulz in bfloat16), torch AdamW for b")
    add("torch-muon-closed", {"name": "muon", "lr": 0.05, "weight_decay": 0.01}, "objective",
        shapes={"x": (2, 3), "y": (3,)}, n=5, note="quadratic over a 2-D (Muon) and a 1-D (AdamW) parameter")
    add("torch-muon-options", {"name": "muon", "lr": 0.05, "nesterov": False, "weight_decay": 0.01,
                               "adjust_lr_fn": "match_rms_adamw", "fallback": {"name": "adamw", "lr": 0.01}},
        "open", shapes={"w": (4, 3), "c": (3, 3)}, n=5, note="no Nesterov, Moonshot's lr adjustment")
    add("torch-muon-fallback", {"name": "muon", "lr": 0.02, "momentum": 0.9, "fallback_params": ["v"],
                                "fallback": {"name": "adam", "lr": 0.003, "weight_decay": 0.0}}, "open",
        shapes=muon_shapes, note="a 2-D parameter routed to the fallback (as for embeddings and heads)")
    add("optax-lion-open", {"name": "lion", "lr": 0.01}, "open", reference="optax", note="optax.lion, wd 0")
    add("optax-lion-closed", {"name": "lion", "lr": 0.1, "weight_decay": 0.1}, "objective", reference="optax", n=6)
    add("optax-lion-betas", {"name": "lion", "lr": 0.02, "betas": [0.95, 0.98], "weight_decay": 0.5}, "open",
        reference="optax")
    add("optax-adam-eps-root", {"name": "adam", "lr": 0.05, "eps_root": 1e-4, "eps": 1e-6}, "open", reference="optax")
    add("optax-amsgrad", {"name": "adam", "lr": 0.1, "amsgrad": True, "amsgrad_variant": "optax"}, "objective",
        reference="optax", n=6, note="optax.amsgrad: max of the bias-corrected v")
    add("optax-amsgrad-raw", {"name": "adam", "lr": 0.05, "amsgrad": True, "amsgrad_variant": "optax_raw",
                              "eps_root": 1e-8}, "open", reference="optax", note="optax.amsgrad(bias_correction_nu=False)")
    add("optax-adamw-amsgrad", {"name": "adamw", "lr": 0.05, "amsgrad": True, "amsgrad_variant": "optax",
                                "weight_decay": 0.1}, "open", reference="optax")
    add("optax-rmsprop", {"name": "rmsprop", "lr": 0.05, "alpha": 0.9, "eps_in_sqrt": True}, "objective",
        reference="optax", n=5, note="optax.rmsprop: eps inside the square root")
    add("optax-rmsprop-centered", {"name": "rmsprop", "lr": 0.01, "eps_in_sqrt": True, "centered": True,
                                   "momentum": 0.9, "eps": 1e-4}, "open", reference="optax")
    add("optax-adagrad", {"name": "adagrad", "lr": 0.1, "eps_in_sqrt": True, "initial_accumulator_value": 0.1,
                          "eps": 1e-7}, "open", reference="optax", note="optax.adagrad's defaults")
    add("optax-adagrad-decay", {"name": "adagrad", "lr": 0.3, "eps_in_sqrt": True, "lr_decay": 0.1,
                                "weight_decay": 0.01}, "objective", reference="optax", n=5)
    add("optax-nadam", {"name": "nadam", "lr": 0.05, "momentum_schedule": False}, "objective", reference="optax",
        n=6, note="optax.nadam: constant beta1")
    add("optax-nadamw", {"name": "nadam", "lr": 0.02, "momentum_schedule": False, "decoupled_weight_decay": True,
                         "weight_decay": 0.1}, "open", reference="optax", note="optax.nadamw")
    wave2(add)
    # AdEMAMix: optax.contrib.ademamix with apple/ml-ademamix's torch warm-ups (tools/_optimizer_refs.py)
    add("optax-ademamix-open", {"name": "ademamix", "lr": 0.01}, "open", reference="optax",
        note="optax.contrib.ademamix, apple/ml-ademamix's defaults (alpha 2, beta3 0.9999)")
    add("optax-ademamix-closed", {"name": "ademamix", "lr": 0.1, "alpha": 5.0, "beta3": 0.999, "weight_decay": 0.1},
        "objective", reference="optax", n=6, note="decay added to the update before the lr")
    add("optax-ademamix-warmup", {"name": "ademamix", "lr": 0.05, "alpha": 8.0, "alpha_warmup": 4, "beta3_warmup": 5,
                                  "weight_decay": 0.05}, "open", reference="optax", n=6,
        note="both warm-ups end inside the run (t = 4 and 5): the reference's schedules at t = count + 1")
    add("optax-ademamix-beta1-zero", {"name": "ademamix", "lr": 0.02, "betas": [0.0, 0.99], "beta3": 0.99,
                                      "beta3_warmup": 3, "eps": 1e-6}, "objective", reference="optax", n=5,
        note="beta1 = 0: the beta3 warm-up starts from f(0 + 1e-8)")
    # cautious updates (C-Optim): pytorch-optimizer's Lion(cautious=True); last, so that the random draws above stay
    po = {"reference": "pytorch_optimizer"}
    add("pytorch-optimizer-lion-cautious-open", {"name": "lion", "lr": 0.01, "cautious": True}, "open", n=5, **po,
        note="Lion(cautious=True): the sign update zeroed where it disagrees with g, the rest scaled by n/(Σm + 1)")
    add("pytorch-optimizer-lion-cautious-closed", {"name": "lion", "lr": 0.1, "weight_decay": 0.1, "cautious": True,
                                                   "maximize": True}, "objective", n=6, **po,
        note="maximize (the mask reads the negated g) and decoupled decay, which is not masked")
    add("pytorch-optimizer-lion-cautious-groups", {"name": "lion", "lr": 0.02, "betas": [0.8, 0.95], "cautious": True,
                                                   "groups": [{"params": ["head.*"], "lr": 0.05, "cautious": False}]},
        "groups", n=5, **po, note="a group without the mask")
    # cautious weight decay: heavyball's AdamW(cautious_weight_decay=True) at eps = 0 (its eps placement differs),
    # betas written out (heavyball's default is (0.9, 0.99))
    hb = {"reference": "heavyball"}
    add("heavyball-adamw-cautious-decay-open", {"name": "adamw", "lr": 0.05, "betas": [0.9, 0.999], "eps": 0.0,
                                                "weight_decay": 0.5,
                                                "cautious_weight_decay": True}, "open", n=5, **hb,
        note="AdamW(cautious_weight_decay=True): the decay only where u·p >= 0 (u the step p moves against)")
    add("heavyball-adamw-cautious-decay-closed", {"name": "adamw", "lr": 0.2, "betas": [0.8, 0.95], "eps": 0.0,
                                                  "weight_decay": 0.3, "cautious_weight_decay": True}, "objective",
        n=6, **hb, note="the steps cross the centre, so the mask changes from update to update")
    add("heavyball-adamw-cautious-decay-groups", {"name": "adamw", "lr": 0.05, "betas": [0.9, 0.99], "eps": 0.0,
                                                  "weight_decay": 0.4,
                                                  "cautious_weight_decay": True, "no_weight_decay": ["*.bias"],
                                                  "groups": [{"params": ["head.*"], "cautious_weight_decay": False}]},
        "groups", n=5, **hb, note="a group that decays every entry and biases without decay")
    # Prodigy: prodigyopt 1.1.2 (one d for every parameter; its defaults: d0 1e-6, no bias correction, growth inf)
    pr = {"reference": "prodigyopt"}
    add("prodigyopt-prodigy-closed", {"name": "prodigy"}, "objective", n=10, **pr,
        note="prodigyopt's defaults: d grows from d0 = 1e-6 as the iterates leave p0")
    add("prodigyopt-prodigy-open", {"name": "prodigy", "lr": 0.5, "weight_decay": 0.1, "use_bias_correction": True,
                                    "d0": 0.01}, "open", n=5, **pr,
        note="bias correction, decoupled decay with d·lr, a parameter without a gradient at update 2")
    add("prodigyopt-prodigy-coupled-safeguard", {"name": "prodigy", "lr": 0.5, "weight_decay": 0.1,
                                                 "decouple": False,
                                                 "safeguard_warmup": True, "d_coef": 2.0, "growth_rate": 1.5,
                                                 "d0": 0.001}, "objective", n=10, shapes={"w": (2, 3), "b": (3,)}, **pr,
        note="decouple=False (L2 in the gradient), safeguard_warmup (lr 0.5 out of the sums), d_coef 2, d capped at "
             "1.5x per update")
    add("prodigyopt-prodigy-groups", {"name": "prodigy", "lr": 0.8, "betas": [0.8, 0.99], "beta3": 0.9, "d0": 0.001,
                                      "weight_decay": 0.05, "no_weight_decay": ["*.bias"],
                                      "groups": [{"params": ["head.*"], "lr": 0.0, "eps": 1e-6, "weight_decay": 0.2}]},
        "objective", n=8, shapes=NAMED, **pr,
        note="a group with lr 0 (no sums or moments, decayed with the shared d·lr), biases without decay, beta3 set")
    add("prodigyopt-prodigy-beta1-zero", {"name": "prodigy", "betas": [0.0, 0.99], "d0": 0.001, "growth_rate": 1.02},
        "objective", n=8, shapes={"w": (2, 3), "b": (3,)}, **pr,
        note="beta1 = 0: no exp_avg, the step d·lr·d·g/(sqrt(v) + d·eps) with the new d (prodigyopt 1.1.2's path)")
    add("prodigyopt-prodigy-bias-corrected", {"name": "prodigy", "lr": 0.8, "use_bias_correction": True,
                                              "safeguard_warmup": True, "weight_decay": 0.05, "d0": 0.001},
        "objective", n=8, shapes={"w": (2, 3), "b": (3,)}, **pr,
        note="what optax.contrib.prodigy computes too: bias-corrected, uncapped, one group, every gradient present")
    for c in cases:
        c.pop("path")
        if c["reference"] == "heavyball":
            c["with_state"] = False
        if c["reference"] == "optax" and c["spec"]["name"] in ("rmsprop", "nadam"):
            c["with_state"] = c["spec"]["name"] == "nadam" or not c["spec"].get("momentum")
    return cases


def random_cases(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` random torch.optim cases: any optimizer and option, random groups and missing gradients."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        name = str(rng.choice(sorted(TORCH)))
        shapes = {"a.weight": (2, 3), "a.bias": (3,), "b.weight": (3, 2), "b.bias": (2,)}
        spec: dict[str, Any] = {"name": name, **_random_options(rng, name)}
        if name != "muon" and rng.random() < 0.6:
            spec["groups"] = [{"params": [str(rng.choice(["a.*", "*.bias", "b.weight"]))],
                               **_random_options(rng, name, group=True)}]
        if name != "muon" and rng.random() < 0.3 and not spec.get("groups"):
            spec["no_weight_decay"] = ["*.bias"]
        n_up = int(rng.integers(1, 8))
        missing = {int(rng.integers(0, n_up)): [str(rng.choice(list(shapes)))]} if rng.random() < 0.5 else None
        out.append({"case_id": f"optimizer/random-{seed}-{i:04d}-{name}", "spec": spec, "reference": "torch",
                    "source": f"generated by tools/gen_optimizer_cases.py --random (seed {seed}) from torch.optim in float64",
                    "params": _rng_params(rng, shapes), "grads": _grads(rng, shapes, n_up, missing)})
    return out


def _random_options(rng: np.random.Generator, name: str, group: bool = False) -> dict[str, Any]:
    u = lambda lo, hi: float(np.round(rng.uniform(lo, hi), 4))  # noqa: E731
    o: dict[str, Any] = {"lr": u(1e-3, 0.2)}
    if rng.random() < 0.5:
        o["weight_decay"] = u(0, 0.2)
    betas = [u(0.0, 0.95), u(0.5, 0.999)]
    if name == "sgd":
        o.update(momentum=u(0.1, 0.95))
        if not group:
            o.update(dampening=u(0, 0.5)) if rng.random() < 0.5 else o.update(nesterov=o["momentum"] > 0)
    elif name in ("adam", "adamw", "adamax", "nadam", "radam"):
        o.update(betas=betas, eps=float(rng.choice([1e-8, 1e-6, 1e-3])))
        if name in ("adam", "adamw") and not group:
            o["amsgrad"] = bool(rng.random() < 0.5)
        if name in ("adam", "nadam", "radam") and not group:
            o["decoupled_weight_decay"] = bool(rng.random() < 0.5)
        if name == "nadam":
            o["momentum_decay"] = u(0, 0.05)
    elif name == "rmsprop":
        o.update(alpha=u(0.5, 0.999), momentum=u(0, 0.9))
        if not group:
            o["centered"] = bool(rng.random() < 0.5)
    elif name == "adagrad":
        o.update(lr_decay=u(0, 0.2), eps=float(rng.choice([1e-10, 1e-6])))
        if not group:
            o["initial_accumulator_value"] = u(0, 0.5)
    elif name == "adafactor":
        o.update(beta2_decay=u(-1.0, -0.3), d=u(1.0, 2.0))
        if not group and rng.random() < 0.5:
            o["eps"] = [str(rng.choice(["auto", "1e-20"])), u(1e-4, 1e-2)]
            o["eps"][0] = o["eps"][0] if o["eps"][0] == "auto" else 1e-20
    elif name == "muon":
        o = {"lr": u(1e-3, 0.05), "momentum": u(0.5, 0.99), "nesterov": bool(rng.random() < 0.5),
             "weight_decay": u(0, 0.1), "adjust_lr_fn": str(rng.choice(["original", "match_rms_adamw"])),
             "fallback": {"name": str(rng.choice(["adamw", "adam", "sgd"])), "lr": u(1e-3, 0.05)}}
    if maximize_ok(name) and rng.random() < 0.2:
        o["maximize"] = True
    return o


def maximize_ok(name: str) -> bool:
    return name != "muon"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--random", type=int, default=0, help="write N random torch.optim cases instead")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = random_cases(args.random, args.seed) if args.random else bundled() + keras_quoted()
    for c in cases:
        file = args.out / (c["case_id"].split("/", 1)[1] + ".toml")
        write_case(file, **c)
    print(f"wrote {len(cases)} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
