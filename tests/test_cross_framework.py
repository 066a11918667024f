"""The same config trained by the torch trainer (the reference: the production path) and the JAX
trainer gives the same run, update by update: loss, every group's lr and the pre-clip grad norm
within the dtype's tolerance, identical skips and loss scales (conformance.run.compare).

- float64 (every bundled config with precision.dtype = "float64"): ≤ 1e-10 relative, the issue's
  bound; measured ≤ 6e-14 over the full bundled runs (docs/jax_trainer.md).
- the bundled configs as written (float32; seed_binary float16): the default tolerance of their
  dtype, and the measured maxima pinned below with a margin, so a loss of agreement shows even
  while it is still inside the tolerance; gpt_tiny in bfloat16 (torch.autocast's semantics).
- float16 with dynamic loss scaling: natural overflows (a 2^24 initial scale) and injected ones
  (run.inject_nonfinite) skip the same updates with the same scales.

CI runs shortened versions (run.max_updates); `-m slow` runs the bundled configs at full length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.config import load_config
from conformance.rules.tolerance import default_tolerance
from conformance.run.compare import compare_runs, describe_failure
from conformance.run.metrics import read_metrics, updates

ROOT = Path(__file__).resolve().parents[1]
F64 = ['precision.dtype="float64"']
SHORT: dict[str, list[str]] = {
    "linear_regression": [],  # 80 updates: the whole run converges (loss ~1e-10 at the end)
    "seed_binary": ["run.max_updates=10", "run.eval_every=5", "run.inject_nonfinite=[2, 6]"],
    "digits_mlp": ["run.max_updates=16", "run.eval_every=8"],
    "gpt_tiny": ["run.max_updates=6", "run.eval_every=3", "schedule.warmup_steps=3"],
    "gpt_tiny_muon": ["run.max_updates=6", "run.eval_every=3", "schedule.warmup_steps=3"],
}
# The float64 variant's own overrides: gpt_tiny_muon's Newton-Schulz in float64 too (its float32
# Newton-Schulz differs by float32 rounding, 1e-8 relative, between the frameworks' matmuls)
F64_EXTRA = {"gpt_tiny_muon": ['optimizer.ns_dtype="float64"']}
# float64: measured 4e-16 .. 6e-14, but linear_regression converges to a loss of 1e-10 whose
# rounding noise (a parameter ulp of 4e-16 against residuals of 1e-5) is 9e-12 relative.
PINNED64 = {"linear_regression": 3e-11}
# The share of the default tolerance that the shortened runs as written use at most (float32;
# seed_binary float16): measured 0.25 (the converged tail, against atol), 0.0011, 0.0039, 0.0015 and
# (gpt_tiny_muon) 0.0008; pinned with a 2-6x margin, so a loss of agreement shows while it is still
# inside the tolerance.
PINNED_USAGE = {"linear_regression": 0.5, "seed_binary": 0.005, "digits_mlp": 0.02, "gpt_tiny": 0.01,
                "gpt_tiny_muon": 0.004}


def train_both(tmp: Path, name: str, overrides: list[str]) -> tuple[Path, Path]:
    from ref_jax.trainer import train as train_jax
    from ref_torch.trainer import train as train_torch

    config = load_config(ROOT / "configs" / f"{name}.toml", ["run.device=\"cpu\"", *overrides])
    train_torch(config, tmp / "torch", progress="none")
    train_jax(config, tmp / "jax", progress="none")
    return tmp / "torch", tmp / "jax"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[tuple[str, str], tuple[Path, Path]] = {}

    def get(name: str, variant: str) -> tuple[Path, Path]:
        if (name, variant) not in cache:
            extra = F64 + F64_EXTRA.get(name, []) if variant == "float64" else []
            cache[name, variant] = train_both(tmp_path_factory.mktemp(f"{name}-{variant}"), name, SHORT[name] + extra)
        return cache[name, variant]

    return get


@pytest.mark.parametrize("name", list(SHORT))
def test_float64_runs_agree_to_1e_10(runs: Any, name: str) -> None:
    a, b = runs(name, "float64")
    result = compare_runs(a, b)
    assert result.tolerance == default_tolerance("float64", "run")
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    assert len(result.rows) == len(updates(read_metrics(a / "metrics.jsonl"))) > 0
    assert max(result.max_rel.values()) <= PINNED64.get(name, 1e-12), result.max_rel


@pytest.mark.parametrize("name", list(SHORT))
def test_bundled_configs_agree_within_their_dtype(runs: Any, name: str) -> None:
    a, b = runs(name, "native")
    result = compare_runs(a, b)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    assert result.max_usage <= PINNED_USAGE[name], (result.max_usage, result.max_rel)
    assert result.max_rel["lr"] <= 6e-8  # float32 rounding of the double-precision schedule, no more


def test_float16_loss_scaling_skips_the_same_updates(tmp_path: Path) -> None:
    # 2^24 overflows float16 gradients at first: the scale backs off to a working one, grows every 3
    # finite updates until it overflows again, and updates 4 and 9 are poisoned on top
    a, b = train_both(tmp_path, "seed_binary", ["run.max_updates=14", "run.eval_every=0", "precision.growth_interval=3",
                                                "precision.init_scale=16777216.0", "run.inject_nonfinite=[4, 9]"])
    ta, tb = updates(read_metrics(a / "metrics.jsonl")), updates(read_metrics(b / "metrics.jsonl"))
    skipped = [r["update"] for r in ta if r["skipped"]]
    assert skipped == [r["update"] for r in tb if r["skipped"]]
    assert [r["loss_scale"] for r in ta] == [r["loss_scale"] for r in tb]
    assert {4, 9} <= set(skipped) and len(skipped) > 2, skipped  # natural overflows as well as injected
    assert len({r["loss_scale"] for r in ta}) > 2  # backoff and growth both happened
    assert compare_runs(a, b).passed


def test_parameter_groups_and_cycled_beta1_agree(tmp_path: Path) -> None:
    # per-group lr and weight decay (set_group_hyperparams) and onecycle's beta1, in float64
    from ref_jax.trainer import train as train_jax
    from ref_torch.trainer import train as train_torch

    config = load_config({
        "model": {"name": "mlp", "hidden": [16, 8]},
        "data": {"name": "binary_blobs", "n_samples": 400, "batch_size": 32},
        "optimizer": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.05,
                      "groups": [{"params": ["*.bias"], "lr": 1e-2, "weight_decay": 0.0}]},
        "schedule": {"name": "onecycle", "total_steps": 20},
        "clip": {"max_norm": 0.5}, "accumulation": {"steps": 2, "normalize": "tokens"},
        "precision": {"dtype": "float64"}, "run": {"max_updates": 20, "eval_every": 10, "device": "cpu"},
    })
    train_torch(config, tmp_path / "torch", progress="none")
    train_jax(config, tmp_path / "jax", progress="none")
    result = compare_runs(tmp_path / "torch", tmp_path / "jax")
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    lrs = [r["lr"] for r in updates(read_metrics(tmp_path / "jax/metrics.jsonl"))]
    assert all(len(x) == 2 for x in lrs) and lrs[5][0] != lrs[5][1]


def test_bfloat16_autocast_agrees(runs: Any, tmp_path: Path) -> None:
    # the JAX model runs torch.autocast's op-level semantics (linear maps in bfloat16 from float32
    # master weights, LayerNorm/GELU/attention computed in float32, float32 residual stream):
    # measured 5e-6 (loss) and 2e-4 (grad norm) relative on gpt_tiny, 2% of the bfloat16 tolerance
    a, b = train_both(tmp_path, "gpt_tiny", SHORT["gpt_tiny"] + ['precision.dtype="bfloat16"'])
    result = compare_runs(a, b)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    assert result.max_usage <= 0.1 and result.max_rel["loss"] <= 5e-5, result.max_rel


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SHORT))
def test_full_bundled_runs_agree(tmp_path: Path, name: str) -> None:
    a, b = train_both(tmp_path, name, [])
    result = compare_runs(a, b)
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
