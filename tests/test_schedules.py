"""Schedules: counting (update t applies the value at t), groups, epochs, restoring, momentum cycling.

Expected values come from torch.optim.lr_scheduler / torch.optim / optax built-ins in float64, hand
calculation or the seeds; the twinstep code under test is ref_torch, ref_jax and the oracle.
"""

from __future__ import annotations

import copy
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from conformance.config import load_config
from conformance.config.schedule import SCHEDULE_NAMES
from conformance.harness.case import collect_cases
from conformance.rules.groups import group_base_lrs
from ref_jax._schedules import build_scheduler as jax_build_scheduler
from ref_torch._schedules import PerEpochLR, build_scheduler

# One config per schedule, small enough for every test to sweep them all.
EXAMPLES: dict[str, dict] = {
    "constant": {"name": "constant", "factor": 0.5, "total_iters": 3},
    "step": {"name": "step", "step_size": 3, "gamma": 0.5},
    "multistep": {"name": "multistep", "milestones": [2, 5], "gamma": 0.3},
    "exponential": {"name": "exponential", "gamma": 0.8},
    "cosine": {"name": "cosine", "t_max": 6, "eta_min": 1e-3},
    "linear": {"name": "linear", "start_factor": 0.2, "total_iters": 4},
    "polynomial": {"name": "polynomial", "total_iters": 6, "power": 2.0},
    "onecycle": {"name": "onecycle", "total_steps": 24, "three_phase": True},
    "cosine_restarts": {"name": "cosine_restarts", "t_0": 2, "t_mult": 2, "eta_min": 1e-3},
    "warmup_cosine": {"name": "warmup_cosine", "warmup_steps": 4, "total_steps": 12, "eta_min": 1e-3},
    "inverse_sqrt": {"name": "inverse_sqrt", "warmup_steps": 3},
    "wsd": {"name": "wsd", "warmup_steps": 3, "total_steps": 16, "decay_steps": 6, "decay_type": "1-sqrt"},
    "sequential": {"name": "sequential", "milestones": [4], "schedulers": [
        {"name": "warmup_cosine", "warmup_steps": 2, "total_steps": 8, "convention": "torch", "start_factor": 0.5},
        {"name": "exponential", "gamma": 0.9}]},
    "chained": {"name": "chained", "schedulers": [
        {"name": "linear", "start_factor": 0.25, "total_iters": 3}, {"name": "step", "step_size": 4, "gamma": 0.5}]},
    "cyclic": {"name": "cyclic", "max_lr": 0.3, "step_size_up": 3, "step_size_down": 5, "mode": "triangular2"},
    "reduce_on_plateau": {"name": "reduce_on_plateau", "patience": 1},
    "tabulated": {"name": "tabulated", "factors": [0.5, 1.0, 0.75, 0.25, 0.1]},
}
FROM_OWN_LR = [n for n in SCHEDULE_NAMES if n != "cyclic"]  # cyclic climbs from each group's lr to one max_lr
TWO_GROUPS = {"name": "sgd", "lr": 0.1, "groups": [{"params": ["head.*"], "lr": 0.02}]}


def config(name: str, **schedule) -> object:
    return load_config({"optimizer": TWO_GROUPS, "schedule": {**EXAMPLES[name], **schedule}})


def values(backend, cfg, steps: int, upe: int = 1) -> dict:
    return backend.function("schedules", "schedule_values")(cfg.schedule, cfg.optimizer, steps, upe)


def test_every_schedule_has_an_example() -> None:
    assert set(EXAMPLES) == set(SCHEDULE_NAMES)


def test_update_t_applies_the_value_at_t(backend) -> None:
    # hand calculation: StepLR(1, 0.5) from 1.0 — update 0 uses the initial lr, update 3 uses 1/8
    cfg = load_config({"optimizer": {"name": "sgd", "lr": 1.0}, "schedule": {"name": "step", "step_size": 1, "gamma": 0.5}})
    assert values(backend, cfg, 4)["lr"][:, 0].tolist() == [1.0, 0.5, 0.25, 0.125]


def test_seed_001_cosine_table_is_misprinted() -> None:
    """Seed 001 §4.2 prints 0.000854 and 0.000156 at steps 1 and 3; the seed's own code prints
    0.000855 and 0.000155 on torch. Pins the misprint (and which entries agree) so the bundled case
    (schedule/seed-001-cosine) keeps torch's values."""
    seed = [0.001, 0.000854, 0.000505, 0.000156, 0.00001]
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4, eta_min=1e-5)
    printed = []
    for _ in range(5):
        printed.append(f"{optimizer.param_groups[0]['lr']:.6f}")
        optimizer.step()
        scheduler.step()
    assert printed == ["0.001000", "0.000855", "0.000505", "0.000155", "0.000010"]
    wrong = [i for i, (p, s) in enumerate(zip(printed, seed)) if abs(float(p) - s) > 0.5e-6]
    assert wrong == [1, 3]
    # the misprints are what eta_min + lr·(1 + cos)/2 (base lr not reduced by eta_min) would give at step 3
    assert f"{1e-5 + 1e-3 * (1 + math.cos(3 * math.pi / 4)) / 2:.6f}" == "0.000156"


def test_group_order_is_file_order_then_default() -> None:
    cfg = load_config({"optimizer": {"name": "sgd", "lr": 0.1, "groups": [
        {"params": ["a.*"], "lr": 0.3}, {"params": ["b.*"]}, {"params": ["c.*"], "lr": 0.5}]}})
    assert group_base_lrs(cfg.optimizer) == [0.3, 0.1, 0.5, 0.1]


@pytest.mark.parametrize("name", FROM_OWN_LR)
def test_every_group_follows_from_its_own_base_lr(backend, name: str) -> None:
    cfg = config(name)
    lr = values(backend, cfg, 20)["lr"]
    # warm-ups scale each group's lr; annealing goes from each group's lr to the absolute eta_min (torch)
    warm = cfg.schedule.warmup_steps or 0
    eta = cfg.schedule.eta_min or 0.0
    scaled, annealed = lr[:warm], lr[warm:]
    np.testing.assert_allclose(scaled[:, 0] * 0.1, scaled[:, 1] * 0.02, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose((annealed[:, 0] - eta) * (0.1 - eta), (annealed[:, 1] - eta) * (0.02 - eta),
                               rtol=1e-12, atol=1e-15)
    assert lr[warm, 0] != lr[warm, 1]


@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if n not in ("onecycle", "reduce_on_plateau")])
def test_unit_epoch_is_the_schedule_at_t_div_updates_per_epoch(backend, name: str) -> None:
    per_update = values(backend, config(name), 12)["lr"]
    per_epoch = values(backend, config(name, unit="epoch"), 36, upe=3)["lr"]
    np.testing.assert_array_equal(per_epoch, per_update[np.arange(36) // 3])


def test_unit_epoch_onecycle(backend) -> None:
    per_update = values(backend, config("onecycle"), 24)
    per_epoch = values(backend, config("onecycle", unit="epoch"), 48, upe=2)
    for key in ("lr", "momentum"):
        np.testing.assert_array_equal(per_epoch[key], per_update[key][np.arange(48) // 2])


def _torch_model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.02}, {"params": model[2].parameters()}],
                          lr=0.1, momentum=0.9)
    return model, opt


def _train(model, opt, scheduler, steps: int) -> list[list[float]]:
    x = torch.linspace(-1, 1, 24, dtype=torch.float64).reshape(8, 3)
    used = []
    for _ in range(steps):
        used.append([g["lr"] for g in opt.param_groups])
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        scheduler.step()
    return used


@pytest.mark.parametrize("name", ["warmup_cosine", "wsd", "onecycle", "sequential", "cosine"])
def test_torch_restore_mid_warmup_continues_identically(name: str) -> None:
    cfg = config(name, unit="epoch")
    upe, cut, total = 2, 5, 20  # update 5: mid warm-up, mid epoch
    model, opt = _torch_model()
    full = _train(model, opt, build_scheduler(cfg.schedule, opt, upe), total)
    ref_params = [p.detach().clone() for p in model.parameters()]
    # interrupted run: state_dict round trip of model, optimizer and scheduler
    model, opt = _torch_model()
    scheduler = build_scheduler(cfg.schedule, opt, upe)
    first = _train(model, opt, scheduler, cut)
    # checkpoints are copies: load_state_dict would otherwise alias the saved momentum buffers
    saved = copy.deepcopy((model.state_dict(), opt.state_dict(), scheduler.state_dict()))
    model2, opt2 = _torch_model(seed=1)
    scheduler2 = build_scheduler(cfg.schedule, opt2, upe, base_lrs=[0.02, 0.1])
    model2.load_state_dict(saved[0])
    opt2.load_state_dict(copy.deepcopy(saved[1]))
    scheduler2.load_state_dict(copy.deepcopy(saved[2]))
    rest = _train(model2, opt2, scheduler2, total - cut)
    assert first + rest == full
    assert all(torch.equal(a, b) for a, b in zip(model2.parameters(), ref_params))
    # rebuilt from the neutral count alone, on an optimizer whose state (and scheduled lrs) was loaded
    model3, opt3 = _torch_model(seed=2)
    model3.load_state_dict(saved[0])
    opt3.load_state_dict(copy.deepcopy(saved[1]))
    scheduler3 = build_scheduler(cfg.schedule, opt3, upe, base_lrs=[0.02, 0.1], start=cut)
    assert _train(model3, opt3, scheduler3, total - cut) == rest
    assert all(torch.equal(a, b) for a, b in zip(model3.parameters(), ref_params))


def test_per_epoch_wrapper_round_trips() -> None:
    cfg = config("step", unit="epoch")
    _, opt = _torch_model()
    scheduler = build_scheduler(cfg.schedule, opt, 3)
    assert isinstance(scheduler, PerEpochLR)
    for _ in range(4):
        opt.step()
        scheduler.step()
    state = scheduler.state_dict()
    _, opt2 = _torch_model()
    again = build_scheduler(cfg.schedule, opt2, 3)
    again.load_state_dict(state)
    for _ in range(10):
        opt.step()
        opt2.step()
        scheduler.step()
        again.step()
        assert again.get_last_lr() == scheduler.get_last_lr()


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_jax_schedules_are_jittable_float64_on_int32_counts(name: str) -> None:
    cfg = config(name)
    with jax.enable_x64(True):
        built = jax_build_scheduler(cfg.schedule, group_base_lrs(cfg.optimizer))
        count = jnp.arange(20, dtype=jnp.int32)
        for fn in built.lr + (built.momentum or ()):
            jitted = jax.jit(jax.vmap(fn))(count)
            assert jitted.dtype == jnp.float64
            eager = np.broadcast_to(np.asarray(fn(count)), (20,))
            np.testing.assert_allclose(np.asarray(jitted), eager, rtol=1e-14, atol=1e-18)
            assert float(jax.jit(fn)(jnp.int32(7))) == pytest.approx(float(eager[7]), rel=1e-14, abs=1e-18)


def jit_mismatches(cases: list) -> list[str]:
    """Every bundled case's JAX schedules over 80 updates (past every end), jitted against eager:
    the updates where they differ by more than 1e-13 relative, or in finiteness or sign.

    1e-13: jit may fuse or reorder a schedule's few float64 operations (a multiply-add, x·(1/k) for
    x/k), each moving its result by about u = 1.1e-16 of the terms it combines; an lr of b + (m − b)·h
    (cyclic, onecycle) carries those terms' size, up to max_lr / base_lr = 100 times the result in the
    bundled cases, so ~4 operations · 100 · u = 4.4e-14, rounded up (measured worst: 1.6e-14, cyclic)."""
    out = []
    count = jnp.arange(80, dtype=jnp.int32)
    with jax.enable_x64(True):
        for case in cases:
            spec = case.sections["schedule"]
            per_epoch = case.inputs.updates_per_epoch if spec.unit == "epoch" else 1
            built = jax_build_scheduler(spec, group_base_lrs(case.sections["optimizer"]), per_epoch)
            for fn in built.lr + (built.momentum or ()):
                eager = np.broadcast_to(np.asarray(fn(count)), (80,))
                jitted = np.asarray(jax.jit(jax.vmap(fn))(count))
                bad = ~np.isclose(jitted, eager, rtol=1e-13, atol=0) | (np.sign(jitted) != np.sign(eager))
                out += [f"{case.id}: update {t} jitted {float(jitted[t])!r}, eager {float(eager[t])!r}" for t in np.flatnonzero(bad)[:1]]
    return out


def scheduled_cases() -> list:
    cases, broken = collect_cases(None, ["schedule/*"])
    assert not broken
    return [c for c in cases if c.sections["schedule"].name != "reduce_on_plateau"]


def test_jax_schedules_jitted_are_the_eager_values_past_every_end() -> None:
    # XLA fuses 1 − s/T into s·(1/T) in a multiply-add: −5.6e-17 at s = T = 10, NaN under a
    # fractional power (docs/divergences.md S-POLY-JIT); the twin's decays stay exact there
    cases = scheduled_cases()
    assert len(cases) > 80 and not jit_mismatches(cases)


def test_negative_control_optax_polynomial_schedule_is_nan_jitted_past_its_end(monkeypatch) -> None:
    import ref_jax._schedules as twin

    def optax_polynomial(init: float, end: float, power: float, steps: float):
        return optax.polynomial_schedule(init, end, power, steps)

    monkeypatch.setattr(twin, "_polynomial", optax_polynomial)
    found = jit_mismatches([c for c in scheduled_cases() if c.id == "schedule/polynomial-power-0.9"])
    assert found and "jitted nan" in found[0], found


def _quadratic_grad(p: np.ndarray) -> np.ndarray:
    return np.array([2.0, 0.5, -1.0]) * (p - np.array([1.0, -2.0, 0.5])) * np.array([3.0, 1.0, 0.2])


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_onecycle_momentum_cycling_end_to_end(opt_name: str) -> None:
    """torch.optim.SGD / Adam under OneCycleLR(cycle_momentum) == optax.inject_hyperparams(optax.sgd /
    optax.adam) driven by twinstep's JAX schedules (lr and momentum / b1), in float64."""
    cfg = load_config({"optimizer": {"name": opt_name, "lr": 0.05},
                       "schedule": {"name": "onecycle", "total_steps": 30, "pct_start": 0.25}})
    steps, p0 = 30, np.array([0.3, 0.7, -1.2])
    param = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float64))
    topt = (torch.optim.SGD([param], lr=0.05, momentum=0.9) if opt_name == "sgd"
            else torch.optim.Adam([param], lr=0.05))
    tsched = torch.optim.lr_scheduler.OneCycleLR(topt, max_lr=0.05, total_steps=30, pct_start=0.25)
    torch_path = []
    for _ in range(steps):
        param.grad = torch.tensor(_quadratic_grad(param.detach().numpy()), dtype=torch.float64)
        topt.step()
        tsched.step()
        torch_path.append(param.detach().numpy().copy())
    with jax.enable_x64(True):
        built = jax_build_scheduler(cfg.schedule, group_base_lrs(cfg.optimizer))
        if opt_name == "sgd":
            tx = optax.inject_hyperparams(optax.sgd)(learning_rate=built.lr[0], momentum=built.momentum[0])
        else:
            tx = optax.inject_hyperparams(optax.adam)(learning_rate=built.lr[0], b1=built.momentum[0])
        p = jnp.asarray(p0)
        state = tx.init(p)
        jax_path = []
        for _ in range(steps):
            updates, state = tx.update(jnp.asarray(_quadratic_grad(np.asarray(p))), state, p)
            p = optax.apply_updates(p, updates)
            jax_path.append(np.asarray(p))
    np.testing.assert_allclose(np.array(jax_path), np.array(torch_path), rtol=1e-10, atol=1e-12)


def test_jax_restore_mid_warmup_continues_identically() -> None:
    """The JAX schedule is a pure function of the optimizer's count: an optax state saved mid warm-up
    and restored (as NumPy arrays) continues on the same lrs and parameters."""
    cfg = config("warmup_cosine")
    with jax.enable_x64(True):
        lr = jax_build_scheduler(cfg.schedule, group_base_lrs(cfg.optimizer)).lr[0]
        tx = optax.inject_hyperparams(optax.sgd)(learning_rate=lr, momentum=0.9)

        def run(p, state, n):
            out = []
            for _ in range(n):
                updates, state = tx.update(jnp.asarray(_quadratic_grad(np.asarray(p))), state, p)
                p = optax.apply_updates(p, updates)
                out.append(float(state.hyperparams["learning_rate"]))
            return p, state, out

        p0 = jnp.asarray([0.3, 0.7, -1.2])
        p_full, _, full = run(p0, tx.init(p0), 10)
        p_mid, mid_state, first = run(p0, tx.init(p0), 2)
        saved = jax.tree.map(np.asarray, (p_mid, mid_state))
        p_end, _, rest = run(*jax.tree.map(jnp.asarray, saved), 8)
    assert first + rest == full
    np.testing.assert_array_equal(np.asarray(p_end), np.asarray(p_full))


def test_random_cases_from_torch_classes_pass_on_every_backend(tmp_path) -> None:
    """tools/gen_schedule_cases.py --random: cases drawn across every torch class and option (sequential,
    per-epoch and multi-group included), expected values from torch, pass at float64 tolerance."""
    import importlib.util
    from pathlib import Path

    from conformance.harness.backends import Backend
    from conformance.harness.case import load_cases
    from conformance.harness.runner import run_case

    path = Path(__file__).resolve().parent.parent / "tools" / "gen_schedule_cases.py"
    spec = importlib.util.spec_from_file_location("gen_schedule_cases", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.random_cases(tmp_path, 16, seed=2026)
    cases = load_cases([tmp_path])
    assert len(cases) == 16
    for c in cases:
        for name in ("torch", "jax", "oracle"):
            result = run_case(c, Backend(name))
            assert result.passed, f"{c.id}[{name}]: {result.message}"
