"""Optimizer cases with [schedule] and [clip] run the trainer's update path.

The bundled cases `conformance/cases/optimizer/update/` come from torch.optim + lr_scheduler +
clip_grad_norm_ / clip_grad_value_ in float64 (tools/gen_update_cases.py); tests/test_cases.py runs
them on torch, jax and the oracle. Here: the generator reproduces them, the oracle's own
`update.run_updates` equals the twins' on the whole path (accumulation, loss scaling, skips, groups,
epoch schedules), and each way of ignoring a table is caught (negative controls)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from conformance.config import ClipSpec, ScheduleSpec, load_config
from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import load_cases
from conformance.harness.kinds import optimizer as optimizer_kind
from conformance.harness.runner import run_case

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "conformance" / "cases" / "optimizer" / "update"
CASES = {c.id: c for c in load_cases([BUNDLED])}
SCHEDULED = sorted(k for k, c in CASES.items() if "schedule" in c.sections)
CLIPPED = sorted(k for k, c in CASES.items() if "clip" in c.sections)


def test_the_bundled_update_cases_cover_schedules_and_clipping() -> None:
    assert len(CASES) >= 7 and len(SCHEDULED) >= 5 and len(CLIPPED) >= 4
    assert all(optimizer_kind.through_update_path(c) for c in CASES.values())


def test_the_generator_reproduces_the_bundled_cases(tmp_path) -> None:
    spec = importlib.util.spec_from_file_location("gen_update_cases", ROOT / "tools" / "gen_update_cases.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in BUNDLED.glob("*.toml"))
    for path in written:
        assert path.read_text() == (BUNDLED / path.name).read_text(), path.name


def test_adam_steplr_update_2_applies_half_the_lr() -> None:
    """The issue's example: with the schedule ignored (the harness before it ran the update path), update 2 moves
    by Adam's step at lr 0.1 instead of 0.05 and misses torch's value by far more than the tolerance."""
    case = CASES["optimizer/torch-adam-steplr"]
    want = float(case.expected.params[2]["theta"])
    a = optimizer_kind.arrays(case)
    constant = Backend("oracle").function("optimizers", "run_trajectory")(case.sections["optimizer"], **a)
    ignored = float(constant["params"][2]["theta"])
    assert abs(ignored - want) > 1e-3, (ignored, want)
    for name in ("torch", "jax", "oracle"):
        assert run_case(case, Backend(name)).passed


def _dropping(backend: str, **reset) -> PatchedBackend:
    real = Backend(backend).function("update", "run_updates")

    def run_updates(config, params, windows, position=0, updates_per_epoch=1):
        return real(config.model_copy(update=reset), params, windows, position, updates_per_epoch)

    return PatchedBackend(backend, patches=(("update", "run_updates", run_updates),), label="dropping")


def _late(backend: str) -> PatchedBackend:
    real = Backend(backend).function("update", "run_updates")
    return PatchedBackend(backend, patches=(("update", "run_updates",
                                             lambda c, p, w, position=0, u=1: real(c, p, w, position + 1, u)),))


def _old_harness(backend: str) -> PatchedBackend:
    """The harness before it ran the update path: the optimizer alone, [schedule] and [clip] silently ignored."""
    trajectory = Backend(backend).function("optimizers", "run_trajectory")

    def run_updates(config, params, windows, position=0, updates_per_epoch=1):
        out = trajectory(config.optimizer, params, grads=[w[0]["g"] for w in windows])
        return {"params": out["params"]}

    return PatchedBackend(backend, patches=(("update", "run_updates", run_updates),))


@pytest.mark.parametrize("backend", ["torch", "oracle"])  # a wrapper around the backend: JAX adds compile time only
@pytest.mark.parametrize("mutant", ["schedule-ignored", "clip-ignored", "schedule-one-update-late", "old-harness"])
def test_negative_control_each_way_of_ignoring_a_table_is_caught(backend: str, mutant: str) -> None:
    bad, ids = {
        "schedule-ignored": (lambda: _dropping(backend, schedule=ScheduleSpec()), SCHEDULED),
        "clip-ignored": (lambda: _dropping(backend, clip=ClipSpec()), CLIPPED),
        "schedule-one-update-late": (lambda: _late(backend), SCHEDULED),
        "old-harness": (lambda: _old_harness(backend), sorted(CASES)),
    }[mutant]
    mutant_backend = bad()
    caught = [i for i in ids if not run_case(CASES[i], mutant_backend).passed]
    assert caught == ids, f"{mutant} on {backend} passes {sorted(set(ids) - set(caught))}"


SHAPES = {"enc.weight": (3, 4), "enc.bias": (3,), "head.weight": (2, 3)}
CONFIGS = {
    "adam-step": {"optimizer": {"name": "adam", "lr": 0.1}, "schedule": {"name": "step", "step_size": 2, "gamma": 0.5}},
    "sgd-onecycle-clip": {"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
                          "schedule": {"name": "onecycle", "total_steps": 20, "max_lr": 0.5}, "clip": {"max_norm": 0.5}},
    "adamw-groups-tokens": {"optimizer": {"name": "adamw", "lr": 0.1, "no_weight_decay": ["*.bias"],
                                          "groups": [{"params": ["head.*"], "lr": 0.01}]},
                            "schedule": {"name": "cosine", "t_max": 5}, "clip": {"max_norm": 1.0},
                            "accumulation": {"steps": 2, "normalize": "tokens"}},
    "adamw-float32-loss-scaling": {"optimizer": {"name": "adamw", "lr": 0.1}, "accumulation": {"steps": 2},
                                   "precision": {"dtype": "float32", "loss_scale": "dynamic", "init_scale": 1024.0,
                                                 "growth_interval": 2}, "schedule": {"name": "exponential", "gamma": 0.9}},
    "adam-epoch-clip-value": {"optimizer": {"name": "adam", "lr": 0.1}, "clip": {"clip_value": 0.3},
                              "schedule": {"name": "step", "step_size": 1, "gamma": 0.5, "unit": "epoch"}},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_oracle_update_path_equals_the_twins(name: str) -> None:
    """Windows 2 and 5 are poisoned (inf loss: skipped, the schedule held), the schedule starts at
    position 1; parameters, lrs, skips and loss scales of every update agree."""
    sections = CONFIGS[name]
    config = load_config({**sections, "precision": sections.get("precision", {"dtype": "float64"})})
    rng = np.random.default_rng(7)
    params = {k: rng.normal(size=s) for k, s in SHAPES.items()}
    windows = [[{"g": {k: rng.normal(size=s) for k, s in SHAPES.items()}, "count": float(rng.integers(1, 4)),
                 "poison": np.inf if t in (2, 5) else 1.0} for _ in range(config.accumulation.steps)]
               for t in range(8)]
    per_epoch = 3 if config.schedule.unit == "epoch" else 1
    runs = {}
    for b in ("torch", "jax", "oracle"):
        backend = Backend(b)
        with backend.context():
            runs[b] = backend.function("update", "run_updates")(config, params, windows, 1, per_epoch)
    atol = 1e-12 if config.precision.param_dtype == "float64" else 1e-6
    want = runs["oracle"]
    assert want["skipped"] == [t in (2, 5) for t in range(8)]
    for b in ("torch", "jax"):
        got = runs[b]
        assert got["skipped"] == want["skipped"] and got["scales"] == want["scales"], b
        for t in range(8):
            for k in SHAPES:
                np.testing.assert_allclose(got["params"][t][k], want["params"][t][k], rtol=0, atol=atol, err_msg=f"{b} {t} {k}")
                assert got["lrs"][t][k] == pytest.approx(want["lrs"][t][k], rel=1e-14, abs=0), (b, t, k)
