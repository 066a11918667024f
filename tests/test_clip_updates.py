"""Clipping the optimizer's step instead of the gradients (`[clip] target = "updates"`): optax's
`optax.chain(optax.adamw(...), optax.clip_by_global_norm(c))`, where the clip sees the updates. The
bundled cases (optimizer/optax-*-then-clip*) pin the update path against optax in float64; here:
the spec's refusals, every clipping rule on each backend against torch's own clip functions applied
to the step a torch.optim optimizer took, both trainers on one config (float64, equal to 1e-12),
and the optax chains of the cases read by from_optax (port) reproduce them. Negative controls: each
bundled case with the gradients clipped instead fails on every backend; a trainer run that clips the
gradients differs; each chain with its clip moved before the optimizer misses its case.
(Snippets: tests/test_port_code.py PATHS "updates-*"; FSDP: tests/test_scale_out.py.)
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conformance.config import load_config
from conformance.errors import ConfigError
from conformance.harness.backends import Backend
from conformance.harness.case import load_case
from conformance.harness.runner import run_case
from conformance.oracle.update import run_updates as oracle_updates
from conformance.run.compare import compare_runs, describe_failure

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parent.parent
CASES = [p for p in sorted((ROOT / "conformance" / "cases" / "optimizer" / "update").glob("*.toml"))
         if tomllib.loads(p.read_text()).get("clip", {}).get("target") == "updates"]
BACKENDS = ("torch", "jax", "oracle")
SHAPES = {"w": (3, 2), "b": (3,)}
UPDATES = 4

# (clip table, the torch.nn.utils calls that clip a list of tensors holding the step in .grad)
RULES: list[tuple[dict[str, Any], Any]] = [
    ({"max_norm": 0.05}, lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.05)),
    ({"max_norm": 0.05, "norm_type": float("inf")}, lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.05, float("inf"))),
    ({"max_norm": 0.02, "per_parameter": True}, lambda ps: [torch.nn.utils.clip_grad_norm_([p], 0.02) for p in ps]),
    ({"clip_value": 0.01}, lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.01)),
    ({"clip_value": 0.012, "max_norm": 0.03},
     lambda ps: (torch.nn.utils.clip_grad_value_(ps, 0.012), torch.nn.utils.clip_grad_norm_(ps, 0.03))),
]


def _problem(seed: int) -> tuple[dict[str, np.ndarray], list[list[dict[str, Any]]]]:
    rng = np.random.default_rng(seed)
    params = {k: rng.normal(size=s) for k, s in SHAPES.items()}
    windows = [[{"g": {k: 3 * rng.normal(size=s) for k, s in SHAPES.items()}, "count": 1, "poison": 1.0}]
               for _ in range(UPDATES)]
    return params, windows


def _config(clip: dict[str, Any]) -> Any:
    return load_config({"optimizer": {"name": "adamw", "lr": 0.1, "weight_decay": 0.1}, "precision": {"dtype": "float64"},
                        "clip": {**clip, "target": "updates"}})


def _torch_loop(params: dict[str, np.ndarray], windows: list, clip: Any) -> list[dict[str, np.ndarray]]:
    """torch.optim.AdamW; after each step the step taken, Δ = p' − p, clipped by torch.nn.utils's own
    functions (Δ handed to them as .grad) and p ← p + clip(Δ): the loop a torch user writes."""
    named = {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float64)) for k, v in params.items()}
    opt = torch.optim.AdamW(named.values(), lr=0.1, weight_decay=0.1)
    out = []
    for window in windows:
        for k, p in named.items():
            p.grad = torch.tensor(window[0]["g"][k], dtype=torch.float64)
        before = {k: p.detach().clone() for k, p in named.items()}
        opt.step()
        steps = [torch.nn.Parameter(torch.zeros_like(p)) for p in named.values()]
        for s, (k, p) in zip(steps, named.items()):
            s.grad = p.detach() - before[k]
        clip(steps)
        with torch.no_grad():
            for s, (k, p) in zip(steps, named.items()):
                p.copy_(before[k] + s.grad)
        out.append({k: p.detach().numpy().copy() for k, p in named.items()})
    return out


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize(("clip", "native"), RULES, ids=[str(sorted(c)) for c, _ in RULES])
def test_every_rule_clips_the_step_as_torch_clips_it(backend_name: str, clip: dict, native: Any) -> None:
    params, windows = _problem(7)
    want = _torch_loop(params, windows, native)
    config = _config(clip)
    if backend_name == "oracle":
        got = oracle_updates(config, params, windows)["params"]
    else:
        b = Backend(backend_name)
        with b.context():
            got = b.module("update").run_updates(config, params, windows)["params"]
    for t in range(UPDATES):
        for k in params:
            # float64, a few roundings of O(1) values: 1e-12 is the suite's twin bound (measured: torch 0,
            # JAX and the oracle 2.2e-16)
            np.testing.assert_allclose(got[t][k], want[t][k], rtol=0, atol=1e-12, err_msg=f"update {t} {k}")
    # the rule bit: without clipping the step the parameters end elsewhere (measured 0.18-0.34 away)
    free = oracle_updates(load_config({"optimizer": {"name": "adamw", "lr": 0.1, "weight_decay": 0.1},
                                       "precision": {"dtype": "float64"}}), params, windows)["params"]
    assert max(float(np.max(np.abs(free[-1][k] - want[-1][k]))) for k in params) > 1e-3


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_negative_control_each_case_with_the_gradients_clipped_fails(path: Path, backend_name: str,
                                                                     tmp_path: Path) -> None:
    # the expected values need the step clipped: the same case clipping the gradients fails (test_cases
    # runs the case as written)
    text = path.read_text()
    assert text.count('target = "updates"') == 1
    moved = tmp_path / path.name
    moved.write_text(text.replace('target = "updates"', 'target = "gradients"'))
    assert not run_case(load_case(moved), Backend(backend_name)).passed


def test_both_trainers_clip_the_step_alike(tmp_path: Path) -> None:
    base = {"model": {"name": "mlp", "hidden": [8]}, "data": {"name": "binary_blobs", "n_samples": 128, "batch_size": 16},
            "optimizer": {"name": "adamw", "lr": 0.05, "weight_decay": 0.1}, "precision": {"dtype": "float64"},
            "run": {"max_updates": 8, "eval_every": 4, "device": "cpu"}, "checkpoint": {"every": 0}}
    clip = {"max_norm": 0.05, "eps": 0.0, "target": "updates"}
    runs = {}
    for fw in ("torch", "jax"):
        trainer = importlib.import_module(f"ref_{fw}.trainer")
        runs[fw] = trainer.train(load_config({**base, "clip": clip}), tmp_path / fw, progress="none")
    result = compare_runs(tmp_path / "torch", tmp_path / "jax")
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    # control: clipping the gradients at the same threshold is another run
    trainer = importlib.import_module("ref_torch.trainer")
    trainer.train(load_config({**base, "clip": {**clip, "target": "gradients"}}), tmp_path / "grads", progress="none")
    assert not compare_runs(tmp_path / "torch", tmp_path / "grads").passed


@pytest.mark.parametrize(("clip", "message"), [
    ({"target": "updates"}, "clip.target 'updates' needs a rule to apply: set max_norm or clip_value"),
    ({"max_norm": 1.0, "target": "updates", "error_if_nonfinite": True}, "clip.error_if_nonfinite is a gradient rule"),
    ({"max_norm": 1.0, "target": "params"}, "clip.target "),
])
def test_the_spec_refuses_a_step_clip_it_cannot_apply(clip: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        load_config({"clip": clip})
    assert "\n" not in str(info.value)


# optax as written: the clip after the optimizer, read by from_optax
CHAINS = {
    "optax-adamw-then-clip-by-global-norm": [
        {"adamw": {"learning_rate": 0.1, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.1}},
        {"clip_by_global_norm": {"max_norm": 0.25}}],
    "optax-sgd-momentum-then-clip": [{"sgd": {"learning_rate": 0.2, "momentum": 0.9}}, {"clip": {"max_delta": 0.03}}],
    "optax-adam-then-clip-value-and-norm": [{"adam": {"learning_rate": 0.1}}, {"clip": {"max_delta": 0.04}},
                                            {"clip_by_global_norm": {"max_norm": 0.1}}],
}


def _run_spec(sections: dict, path: Path) -> tuple[list, list]:
    data = tomllib.loads(path.read_text())
    windows = [[{"g": g, "count": 1.0, "poison": 1.0}] for g in data["inputs"]["grads"]]
    params = {k: np.asarray(v, np.float64) for k, v in data["inputs"]["params"].items()}
    config = load_config({**sections, "precision": {"dtype": "float64"}})
    return oracle_updates(config, params, windows)["params"], data["expected"]["params"]


@pytest.mark.parametrize("case_id", sorted(CHAINS))
def test_optax_chains_that_clip_the_updates_port_to_their_cases(case_id: str) -> None:
    from conformance.port import from_optax

    spec = from_optax({"optax": {"chain": CHAINS[case_id]}})
    assert spec["clip"]["target"] == "updates"
    got, want = _run_spec(spec, ROOT / "conformance" / "cases" / "optimizer" / "update" / f"{case_id}.toml")
    for t, (g, w) in enumerate(zip(got, want)):
        for k in w:  # the cases' own float64 tolerance (atol 1e-12); measured <= 1.1e-15 on values up to 1.9
            np.testing.assert_allclose(g[k], w[k], rtol=0, atol=1e-12, err_msg=f"update {t} {k}")
    # negative control: the same clip before the optimizer (the gradients clipped) is another run
    # (measured 0.038-0.31 away)
    moved = from_optax({"optax": {"chain": CHAINS[case_id][1:] + CHAINS[case_id][:1]}})
    got, _ = _run_spec(moved, ROOT / "conformance" / "cases" / "optimizer" / "update" / f"{case_id}.toml")
    assert max(float(np.max(np.abs(got[-1][k] - want[-1][k]))) for k in want[-1]) > 1e-3


def test_a_chain_that_clips_both_sides_is_refused() -> None:
    from conformance.errors import UnsupportedError
    from conformance.port import from_optax

    clip = {"clip_by_global_norm": {"max_norm": 1.0}}
    with pytest.raises(UnsupportedError, match=r"optax.chain\[2\].clip_by_global_norm: the gradients are clipped "
                                               r"already; twinstep clips the gradients or the updates"):
        from_optax({"optax": {"chain": [clip, {"adam": {"learning_rate": 0.1}}, clip]}})


def test_hf_trainer_arguments_refuse_a_step_clip() -> None:
    # TrainingArguments' max_grad_norm clips the gradients; the step clip has no form there
    from conformance.errors import UnsupportedError
    from conformance.port.write.hf_args import hf_arguments

    base = {"optimizer": {"name": "adamw"}, "run": {"max_updates": 10}}
    assert hf_arguments(load_config({**base, "clip": {"max_norm": 1.0}}))[0]["max_grad_norm"] == 1.0  # control
    with pytest.raises(UnsupportedError, match=r"clip = .*'target': 'updates'.* has no TrainingArguments form"):
        hf_arguments(load_config({**base, "clip": {"max_norm": 1.0, "target": "updates"}}))
