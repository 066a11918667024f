"""Negative controls: deliberately wrong schedules that the bundled cases must catch.

Each control runs a bundled case through the real harness with one mistake injected (a scheduler
stepped per micro-batch, `schedule(t + 1)`, optax's int32 count, optax's cosine clamp, triangular2
without halving, a plateau without cooldown or with optax's patience, a chained schedule that does
not multiply, Keras's m_mul or optax's end value dropped, ...) and asserts that the case FAILS,
while the same case passes on the unmodified backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ref_jax._schedules as jax_schedules
from conformance.harness.backends import Backend, PatchedBackend
from conformance.harness.case import CASES_DIR, load_case, parse_case
from conformance.harness.runner import run_case

CASES = CASES_DIR / "schedule"


def mutant(name: str, mutate: Callable[..., dict]) -> PatchedBackend:
    """Backend `name` whose schedule_values is wrapped by `mutate(real_fn, schedule, optimizer, steps, upe)`
    (at= and metrics= pass through to the real function)."""
    real = Backend(name).function("schedules", "schedule_values")

    def schedule_values(schedule: Any, optimizer: Any, steps: int, upe: int = 1, **kw: Any) -> dict:
        return mutate(lambda *a: real(*a, **kw), schedule, optimizer, steps, upe)

    label = getattr(mutate, "__name__", "mutant")
    return PatchedBackend(name, patches=(("schedules", "schedule_values", schedule_values),), label=label)


def case(path: str):
    return load_case(CASES / path)


def caught(case_, backend: Backend) -> bool:
    real = run_case(case_, Backend(backend.name))
    assert real.passed, f"the control's case must pass unmodified: {real.message}"
    return not run_case(case_, backend).passed


def per_micro_batch(k: int) -> Callable[..., dict]:
    # the scheduler stepped once per micro-batch of a k-micro-batch update: update t applies f(k·t)
    def mutate(fn, schedule, optimizer, steps, upe):
        out = fn(schedule, optimizer, steps * k, upe)
        return {**out, "lr": out["lr"][::k]}

    return mutate


def off_by_one(fn, schedule, optimizer, steps, upe):
    # scheduler.step() before optimizer.step(): update t applies f(t + 1)
    out = fn(schedule, optimizer, steps + 1, upe)
    return {**out, "lr": out["lr"][1:]}


def default_lr_for_all(fn, schedule, optimizer, steps, upe):
    # every group follows the top-level lr (group overrides ignored)
    out = fn(schedule, optimizer, steps, upe)
    return {**out, "lr": np.repeat(out["lr"][:, -1:], out["lr"].shape[1], axis=1)}


def epoch_unit_ignored(fn, schedule, optimizer, steps, upe):
    # a per-epoch schedule stepped every update
    return fn(schedule.model_copy(update={"unit": "update"}), optimizer, steps, 1)


def peak_one_update_early(fn, schedule, optimizer, steps, upe):
    # the warm-up reaches the peak at update W - 1 (the seed's 1-based reading applied to 0-based t)
    spec = schedule.model_copy(update={"warmup_steps": schedule.warmup_steps - 1, "total_steps": schedule.total_steps - 1})
    return fn(spec, optimizer, steps, upe)


COUNTING_MISTAKES = [  # (id, case, mistake)
    ("per-micro-batch-warmup", "generated/warmup-cosine-torch.toml", per_micro_batch(4)),
    ("per-micro-batch-step", "generated/step-default-gamma.toml", per_micro_batch(2)),
    ("off-by-one-warmup", "generated/warmup-cosine-optax.toml", off_by_one),
    ("off-by-one-seed", "seed-001-steplr.toml", off_by_one),
    ("groups-ignored", "generated/step-two-groups.toml", default_lr_for_all),
    ("epoch-unit-ignored", "generated/step-per-epoch.toml", epoch_unit_ignored),
    ("peak-one-early", "seed-000-warmup-cosine-from-zero.toml", peak_one_update_early),
]


@pytest.mark.parametrize(("name", "path", "mutate"), [
    pytest.param(name, path, mutate, id=f"{mistake}[{name}]")
    for mistake, path, mutate in COUNTING_MISTAKES for name in ("torch", "jax")])
def test_wrong_counting_is_caught(name: str, path: str, mutate) -> None:
    assert caught(case(path), mutant(name, mutate))


def test_uncast_int32_count_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # optax's int32 count without the float64 cast: int32 / int is float32 (semantics.md §0.2)
    def int32_step(count: Any, updates_per_epoch: int = 1) -> Any:
        count = jnp.asarray(count)
        return count // updates_per_epoch if updates_per_epoch != 1 else count

    c = case("generated/exponential-0.9.toml")
    assert run_case(c, Backend("jax")).passed
    monkeypatch.setattr(jax_schedules, "schedule_step", int32_step)
    result = run_case(c, Backend("jax"))
    assert not result.passed and result.max_abs_err > 1e-12


def test_optax_cosine_clamp_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # optax.cosine_decay_schedule holds eta_min past t_max; torch's CosineAnnealingLR climbs back
    def clamped(b: float, eta: float, t_max: int):
        unit = optax.cosine_decay_schedule(1.0, t_max)
        return lambda s: eta + (b - eta) * unit(s)

    c = case("generated/cosine-past-t-max.toml")
    monkeypatch.setattr(jax_schedules, "_torch_cosine", clamped)
    assert not run_case(c, Backend("jax")).passed


def test_optax_onecycle_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # optax.cosine_onecycle_schedule puts the phase ends at int(pct·T) and T, one update later than torch
    real = jax_schedules.lr_schedule

    def optax_onecycle(spec, b):
        if spec.name != "onecycle":
            return real(spec, b)
        return optax.cosine_onecycle_schedule(spec.total_steps, b, spec.pct_start, spec.div_factor,
                                              spec.final_div_factor)

    c = case("generated/onecycle-defaults-sgd.toml")
    monkeypatch.setattr(jax_schedules, "lr_schedule", optax_onecycle)
    assert not run_case(c, Backend("jax")).passed


def test_sequential_without_restart_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # a part that continues from the global count instead of restarting at its milestone
    def join(schedules, boundaries):
        def schedule(step):
            out = schedules[0](step)
            for boundary, fn in zip(boundaries, schedules[1:]):
                out = jnp.where(step < boundary, out, fn(step))
            return out
        return schedule

    c = case("generated/sequential-linear-exponential.toml")
    monkeypatch.setattr(jax_schedules.optax, "join_schedules", join)
    assert not run_case(c, Backend("jax")).passed


def test_momentum_not_cycled_is_caught() -> None:
    def fixed_momentum(fn, schedule, optimizer, steps, upe):
        out = fn(schedule, optimizer, steps, upe)
        return {**out, "momentum": np.full_like(out["momentum"], schedule.max_momentum)}

    assert caught(case("generated/onecycle-defaults-sgd.toml"), mutant("torch", fixed_momentum))


def test_seed_cosine_misprint_is_caught(tmp_path) -> None:
    """The seed's printed cosine table (two misprints) as expected values fails on every backend."""
    c = case("seed-001-cosine.toml")
    text = (CASES / "seed-001-cosine.toml").read_text()
    wrong = text.replace("[0.001, 0.000855, 0.000505, 0.000155, 0.00001]", "[0.001, 0.000854, 0.000505, 0.000156, 0.00001]")
    assert wrong != text
    import tomllib

    bad = parse_case(tomllib.loads(wrong), tmp_path / "seed-misprint.toml")
    for name in ("torch", "jax", "oracle"):
        assert run_case(c, Backend(name)).passed
        assert not run_case(bad, Backend(name)).passed


def _with(**update: Any) -> Callable[..., dict]:
    # the schedule run with some of its fields changed: the mistake a port makes
    def mutate(fn, schedule, optimizer, steps, upe):
        return fn(schedule.model_copy(update=update), optimizer, steps, upe)

    mutate.__name__ = "-".join(f"{k}={v}" for k, v in update.items())
    return mutate


def only_last_part(fn, schedule, optimizer, steps, upe):
    # chained read as its last part alone (the factors not multiplied)
    return fn(schedule.schedulers[-1], optimizer, steps, upe)


def momentum_with_the_lr(fn, schedule, optimizer, steps, upe):
    # cyclic momentum cycled with the lr instead of against it
    out = fn(schedule, optimizer, steps, upe)
    m = out["momentum"]
    return {**out, "momentum": schedule.base_momentum + schedule.max_momentum - m}


def optimizer_lr_kept(fn, schedule, optimizer, steps, upe):
    # CyclicLR's base_lr taken as a cap instead of overriding the groups' lr
    return fn(schedule.model_copy(update={"base_lr": None}), optimizer, steps, upe)


def spots_off_by_one(fn, schedule, optimizer, steps, upe):
    # spot values read one update late
    out = fn(schedule, optimizer, steps + 1, upe)
    return {k: (v[1:] if isinstance(v, np.ndarray) else v) for k, v in out.items()}


PEER_MISTAKES = [  # (id, case, mistake, backends)
    ("triangular2-without-halving", "generated/cyclic-triangular2-no-momentum.toml", _with(mode="triangular"), "tj"),
    ("exp-range-without-gamma", "generated/cyclic-exp-range-adam-beta1.toml",
     _with(mode="triangular", scale_mode="cycle", gamma=1.0), "tj"),
    ("cyclic-momentum-with-the-lr", "generated/cyclic-triangular-sgd-momentum.toml", momentum_with_the_lr, "tj"),
    ("cyclic-base-lr-ignored", "generated/cyclic-triangular-sgd-momentum.toml", optimizer_lr_kept, "tj"),
    ("cyclic-step-size-down-ignored", "generated/cyclic-triangular2-no-momentum.toml", _with(step_size_down=3), "tj"),
    ("plateau-without-cooldown", "generated/plateau-min-rel-cooldown-min-lr.toml", _with(cooldown=0), "tj"),
    ("plateau-without-min-lr", "generated/plateau-max-abs-cooldown-min-lr-groups.toml", _with(min_lr=0.0), "tj"),
    ("plateau-optax-patience", "generated/plateau-min-rel-cooldown-min-lr.toml", _with(patience=2), "tj"),
    ("plateau-without-eps", "generated/plateau-eps-stops-small-reductions.toml", _with(eps=0.0), "tj"),
    ("plateau-abs-read-as-rel", "generated/plateau-max-abs-cooldown-min-lr-groups.toml",
     _with(threshold_mode="rel"), "tj"),
    ("chained-only-last-part", "generated/chained-linear-cosine.toml", only_last_part, "tj"),
    ("m-mul-ignored", "generated/keras-restarts-test-mmul.toml", _with(m_mul=1.0), "tj"),
    ("end-value-ignored", "generated/optax-exponential-end-value.toml", _with(end_factor=None), "tj"),
    ("spots-off-by-one", "generated/cyclic-triangular2-spots.toml", spots_off_by_one, "tj"),
]


@pytest.mark.parametrize(("name", "path", "mutate"), [
    pytest.param(name, path, mutate, id=f"{mistake}[{name}]")
    for mistake, path, mutate, which in PEER_MISTAKES for name in ("torch", "jax") if name[0] in which])
def test_wrong_peer_semantics_are_caught(name: str, path: str, mutate) -> None:
    assert caught(case(path), mutant(name, mutate))


def test_metrics_observed_one_update_early_is_caught() -> None:
    """The metric of update t used for update t's own lr (observed before the update, not after)."""
    c = case("generated/plateau-min-rel-cooldown-min-lr.toml")
    real = Backend("torch").function("schedules", "schedule_values")

    def early(schedule: Any, optimizer: Any, steps: int, upe: int = 1, **kw: Any) -> dict:
        metrics = [*kw.pop("metrics")[1:], 0.0]
        return real(schedule, optimizer, steps, upe, metrics=metrics, **kw)

    assert caught(c, PatchedBackend("torch", patches=(("schedules", "schedule_values", early),), label="early"))


def test_optax_staircase_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # optax.exponential_decay(staircase=True) under a float64 count: a boundary one update early (S-STAIRCASE)
    def optax_staircase(b: float, k: int, gamma: float, end: Any):
        return optax.exponential_decay(b, k, gamma, staircase=True, end_value=end)

    c = case("generated/step-size-49-boundaries.toml")
    assert run_case(c, Backend("jax")).passed
    monkeypatch.setattr(jax_schedules, "_staircase", optax_staircase)
    assert not run_case(c, Backend("jax")).passed
