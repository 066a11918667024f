"""Cautious weight decay (`cautious_weight_decay = true` on adamw, lion, muon, ademamix and every optimizer
with decoupled_weight_decay = true; Chen et al. 2025,
heavyball's cautious_weight_decay, nanochat's Muon): the decoupled decay only where the step moves the
parameter toward zero. The bundled cases (optimizer/heavyball-adamw-cautious-decay-*) pin AdamW against
heavyball 3.2.1 in float64; here each optimizer's twins against the oracle, the cases' negative control
(the plain decay fails them), the `port` snippets, both trainers on nanochat's Muon + AdamW set-up, and
the refusals.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.optimizers import run_all, spec_of, worst
from test_port_code import check_both

from conformance.config import load_config
from conformance.errors import ConfigError
from conformance.run.compare import compare_runs, describe_failure

pytestmark = pytest.mark.usefixtures("persistent_xla_cache", "one_thread")
ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "conformance" / "cases" / "optimizer").glob("heavyball-adamw-cautious-decay-*.toml"))
SPECS = {
    "adamw": {"name": "adamw", "lr": 0.05, "weight_decay": 0.3},
    "lion": {"name": "lion", "lr": 0.02, "weight_decay": 0.5, "cautious": True},
    "muon": {"name": "muon", "lr": 0.05, "weight_decay": 0.3, "ns_dtype": "float64",
             "fallback": {"name": "adamw", "lr": 0.01, "weight_decay": 0.2, "cautious_weight_decay": True}},
    "ademamix": {"name": "ademamix", "lr": 0.02, "weight_decay": 0.3, "alpha_warmup": 3},
    **{f"{n}-decoupled": {"name": n, "lr": 0.05, "weight_decay": 0.4, "decoupled_weight_decay": True, **extra}
       for n, extra in (("sgd", {"momentum": 0.9}), ("adam", {"amsgrad": True}), ("rmsprop", {"centered": True}),
                        ("adagrad", {"lr_decay": 0.1}), ("adamax", {}), ("nadam", {}), ("radam", {}))},
}


def _stream(seed: int) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(8)]
    del grads[2]["b"]  # a parameter without a gradient keeps its value: no decay either
    return params, grads


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_twins_decay_where_the_oracle_does(name: str) -> None:
    params, grads = _stream(11)
    spec = spec_of({**SPECS[name], "cautious_weight_decay": True})
    out = run_all(spec, params, grads, "float64")
    assert worst(out["torch"], out["oracle"]) <= 1e-12 and worst(out["jax"], out["oracle"]) <= 1e-12
    plain = run_all(spec_of(SPECS[name]), params, grads, "float64", backends=("oracle",))["oracle"]
    # control: the mask changes the run (measured 0.038 for ademamix to 0.12 for nadam, normwise relative)
    assert worst(plain, out["oracle"], states=False) > 1e-4


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_each_case_fails_with_the_plain_decay(path: Path, tmp_path: Path) -> None:
    from conformance import tomlio
    from conformance.harness.backends import Backend
    from conformance.harness.case import load_case
    from conformance.harness.runner import run_case

    data = tomllib.loads(path.read_text())
    opt = data["optimizer"]
    assert run_case(load_case(path), Backend("oracle")).passed
    plain = {**opt, "cautious_weight_decay": False}
    if "groups" in opt:
        plain["groups"] = [{k: v for k, v in g.items() if k != "cautious_weight_decay"} for g in opt["groups"]]
    changed = tmp_path / "plain.toml"
    changed.write_text(tomlio.dumps({**data, "optimizer": plain}))
    assert not run_case(load_case(changed), Backend("oracle")).passed


def test_the_mask_is_the_papers_sign_rule() -> None:
    # hand calculation, one AdamW update from zero moments at eps = 0: u = sign(g), so p ← p − lr·sign(g)
    # − lr·wd·p where sign(g) = sign(p), and p − lr·sign(g) elsewhere
    p, g = np.array([1.0, -1.0, 2.0, -2.0]), np.array([0.5, 0.5, -3.0, -3.0])
    spec = spec_of({"name": "adamw", "lr": 0.1, "eps": 0.0, "weight_decay": 0.5, "cautious_weight_decay": True})
    want = np.array([1.0 - 0.1 - 0.05, -1.0 - 0.1, 2.0 + 0.1, -2.0 + 0.1 + 0.1])
    for backend, got in run_all(spec, {"p": p}, [{"p": g}], "float64").items():
        # u = ±1 exactly (m̂ = g, √v̂ = |g|), so each entry is ≤ 3 roundings of values below 2.1, each
        # ≤ 2.2e-16: 6.7e-16 < 1e-15 (measured 0 on every backend)
        np.testing.assert_allclose(got["params"][0]["p"], want, rtol=0, atol=1e-15, err_msg=backend)


@pytest.mark.parametrize("eps, equal", [(0.0, True), (1e-8, False)])
def test_heavyball_adds_eps_as_a_floor(eps: float, equal: bool) -> None:
    # O-CWD's pin: heavyball's AdamW divides by max(√v̂, ε), torch's by √v̂ + ε; the same at ε = 0
    import torch

    heavyball = pytest.importorskip("heavyball")
    params, grads = _stream(5)
    del grads[2]  # heavyball steps every parameter it holds
    kw = {"lr": 0.05, "betas": (0.9, 0.999), "eps": eps, "weight_decay": 0.3}
    runs, previous = [], torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # heavyball makes its scalars (lr, betas) in the default dtype
    try:
        for make in (lambda ps: torch.optim.AdamW(ps, **kw),
                     lambda ps: heavyball.AdamW(ps, storage_dtype="float64", compile_step=False, **kw)):
            ps = [torch.nn.Parameter(torch.tensor(params[k])) for k in params]
            opt = make(ps)
            for g in grads:
                for p, k in zip(ps, params):
                    p.grad = torch.tensor(g[k])
                opt.step()
            runs.append([p.detach().numpy() for p in ps])
    finally:
        torch.set_default_dtype(previous)
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(*runs))
    assert (err < 1e-14) is equal, err  # measured 8.9e-16 at 0 and 2.1e-8 at 1e-8


@pytest.mark.parametrize("name", ["adamw", "lion", "ademamix", "sgd-decoupled", "adam-decoupled", "rmsprop-decoupled",
                                  "adagrad-decoupled", "nadam-decoupled"])
def test_the_snippets_decay_cautiously(name: str) -> None:
    from conformance.config import Config

    table = {**SPECS[name], "cautious_weight_decay": True, "groups": [{"params": ["*.bias"], "lr": 0.02}]}
    config: Config = load_config({"optimizer": table, "precision": {"dtype": "float64"}})
    check_both(config, poison=())


def test_the_snippets_decay_cautiously_for_muon_and_its_fallback() -> None:
    config = load_config({"optimizer": {**SPECS["muon"], "cautious_weight_decay": True},
                          "precision": {"dtype": "float64"}})
    check_both(config, poison=())


@pytest.mark.parametrize("table, message", [
    ({"name": "sgd", "cautious_weight_decay": True}, "optimizer.cautious_weight_decay needs decoupled_weight_decay "
                                                     "= true for sgd"),
    ({"name": "adam", "decoupled_weight_decay": True, "groups": [{"params": ["*"], "decoupled_weight_decay": False,
                                                                  "cautious_weight_decay": True}]},
     r"optimizer.groups\[0\].cautious_weight_decay needs decoupled_weight_decay = true for adam"),
    ({"name": "adafactor", "cautious_weight_decay": True}, "optimizer.cautious_weight_decay is only used when name is"),
    ({"name": "adamw", "groups": [{"params": ["*"], "cautious_weight_decay": 1}]}, "cautious_weight_decay"),
])
def test_the_spec_refuses_it_where_no_decoupled_decay_reads_it(table: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config({"optimizer": table})


@pytest.mark.parametrize("backend", ["optax-native", "torch-native", "keras"])
def test_the_natives_refuse_it(backend: str) -> None:
    from conformance.harness.backends import Backend
    from conformance.harness.case import load_case
    from conformance.harness.runner import run_case

    result = run_case(load_case(CASES[0]), Backend(backend))
    assert result.status == "unsupported" and "cautious_weight_decay" in result.message, result


RECIPE: dict[str, Any] = {  # nanochat's pairing: Muon with cautious decay, AdamW for the rest
    "model": {"name": "mlp", "hidden": [8]},
    "data": {"name": "binary_blobs", "n_samples": 256, "batch_size": 16},
    "optimizer": {"name": "muon", "lr": 0.02, "weight_decay": 0.2, "cautious_weight_decay": True,
                  "fallback": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.05}},
    "schedule": {"name": "cosine", "t_max": 8},
    "precision": {"dtype": "float64"},
    "checkpoint": {"every": 0},
    "run": {"max_updates": 8, "eval_every": 0, "device": "cpu"},
}


def test_both_trainers_train_nanochats_muon_alike(tmp_path: Path) -> None:
    def train(framework: str, recipe: dict, out: Path) -> None:
        importlib.import_module(f"ref_{framework}.trainer").train(load_config(recipe), out, progress="none")

    for framework in ("torch", "jax"):
        train(framework, RECIPE, tmp_path / framework)
    plain = {**RECIPE, "optimizer": {**RECIPE["optimizer"], "cautious_weight_decay": False}}
    train("torch", plain, tmp_path / "plain")
    result = compare_runs(tmp_path / "torch", tmp_path / "jax")
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    assert not compare_runs(tmp_path / "plain", tmp_path / "jax").passed  # control: the decay is cautious
