"""Schedules of hyper-parameters other than the lr (`[schedule.hyper.<key>]`): modded-nanogpt's Muon
momentum warm-up, weight decay that follows the lr, betas that move. The bundled cases
(optimizer/torch-*-warmup, -wd-follows-lr, -beta2-warmup-beta1-decay) pin the update path against
torch.optim with the values set by hand; here: the spec's and the rules' refusals, the values
`schedule_values` reports on each backend against the recipe's own formula, both trainers on one
config with z-loss, a Muon momentum warm-up and nanochat's cautious weight decay (float64, equal to
1e-10; a run without the warm-up is the control), and a real `twinstep train` process killed inside a
warm-up update that resumes bit for bit. Negative controls: each case without its hyper schedule fails; a resume that restarts
the warm-up, or a JAX step that ignores it, is caught.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.faults import fault_args
from support.processes import PROCESS_S, child_env, run_process
from support.resume import cut_after, differences

from conformance import checkpoint as ck
from conformance import tomlio
from conformance.config import load_config
from conformance.errors import ConfigError
from conformance.harness.case import load_case
from conformance.run.compare import compare_runs, describe_failure

pytestmark = pytest.mark.usefixtures("persistent_xla_cache", "one_thread")
ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "conformance" / "cases" / "optimizer" / "update").glob("*.toml"))
HYPER_CASES = [p for p in CASES if "hyper" in tomllib.loads(p.read_text()).get("schedule", {})]
FRAMEWORKS = ("torch", "jax")
UPDATES, CUT = 12, 6
WARMUP = {"name": "linear", "start_factor": 0.85 / 0.95, "end_factor": 1.0, "total_iters": 10}
RECIPE: dict[str, Any] = {
    "model": {"name": "mlp", "hidden": [8]},
    "data": {"name": "binary_blobs", "n_samples": 256, "batch_size": 16},
    "loss": {"name": "cross_entropy", "z_loss": 1e-2},
    "optimizer": {"name": "muon", "lr": 0.02, "momentum": 0.95, "weight_decay": 0.01, "cautious_weight_decay": True,
                  "fallback": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.05}},  # nanochat's cautious decay
    "schedule": {"name": "cosine", "t_max": UPDATES, "hyper": {"momentum": WARMUP,
                                                              "weight_decay": {"name": "cosine", "t_max": UPDATES}}},
    "precision": {"dtype": "float64"},
    "checkpoint": {"every": 3, "keep_last": 100},
    "run": {"max_updates": UPDATES, "eval_every": 6, "device": "cpu"},
}
INSIDE = {"torch": ("micro_batch", {"update": 8, "index": 0}), "jax": ("dispatched", {"update": 8})}


def _config(**schedule: Any) -> Any:
    return load_config({**RECIPE, "schedule": {**RECIPE["schedule"], **schedule}})


def train(framework: str, config: Any, out: Path, **kw: Any) -> Any:
    return importlib.import_module(f"ref_{framework}.trainer").train(config, out, progress="none", **kw)


@pytest.mark.parametrize(("schedule", "message"), [
    ({"hyper": {"momentum": {"name": "onecycle", "total_steps": 5}}}, "hyper.momentum.name cannot be 'onecycle'"),
    ({"hyper": {"momentum": {"name": "reduce_on_plateau"}}}, "hyper.momentum.name cannot be 'reduce_on_plateau'"),
    ({"hyper": {"momentum": {"name": "linear", "hyper": {"beta1": {"name": "constant"}}}}}, "cannot be nested"),
    ({"name": "sequential", "milestones": [2], "schedulers": [
        {"name": "constant", "hyper": {"momentum": {"name": "constant"}}}, {"name": "constant"}]},
     "schedulers[0].hyper must be set on the outer schedule"),
    ({"unit": "epoch", "hyper": {"momentum": {"name": "constant", "unit": "update"}}}, "hyper.momentum.unit must equal"),
    ({"hyper": {"momentum_decay": {"name": "constant"}}}, "schedule.hyper"),
])
def test_the_spec_refuses_what_a_hyper_schedule_cannot_be(schedule: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config({"optimizer": {"name": "sgd", "momentum": 0.9}, "schedule": schedule})


@pytest.mark.parametrize(("optimizer", "hyper", "message"), [
    ({"name": "sgd"}, {"beta1": {"name": "constant"}}, "no parameter group's optimizer reads betas"),
    ({"name": "adam", "betas": [0.9, 0.99]}, {"beta2": {"name": "linear", "start_factor": 1.02, "total_iters": 3}},
     "can reach beta2 = 1.0098"),
    ({"name": "schedule_free_adamw"}, {"weight_decay": {"name": "constant"}}, "averaging assumes fixed"),
    ({"name": "ademamix"}, {"beta1": {"name": "constant"}}, "beta3 warm-up"),
    ({"name": "adamw", "weight_decay": 0.01}, {"weight_decay": {"name": "cosine", "t_max": 5, "eta_min": 0.1}},
     "eta_min = 0.1 is above the lowest group weight_decay"),
    ({"name": "adafactor"}, {"eps": {"name": "constant"}}, "adafactor .its eps is torch's pair"),
    ({"name": "muon", "fallback": {"name": "adafactor"}}, {"eps": {"name": "constant"}}, "not supported with adafactor"),
    ({"name": "sgd", "momentum": 0.9, "dampening": 0.8}, {"dampening": {"name": "linear", "start_factor": 1.5,
                                                                        "total_iters": 3}},
     r"can reach dampening = 1.2 .*at most 1"),
    ({"name": "rmsprop", "alpha": 0.99}, {"alpha": {"name": "linear", "start_factor": 1.02, "total_iters": 3}},
     "can reach alpha = 1.0098 .*rmsprop's smoothing constant"),
    ({"name": "ademamix", "beta3": 0.999}, {"beta3": {"name": "tabulated", "factors": [0.9, 1.002]}},
     r"can reach beta3 = 1.001 .*below 1"),
    ({"name": "sgd", "momentum": 0.9}, {"alpha": {"name": "constant"}}, "no parameter group's optimizer reads alpha"),
])
def test_the_rules_refuse_a_hyper_schedule_the_optimizer_cannot_take(optimizer: dict, hyper: dict,
                                                                    message: str) -> None:
    from conformance.oracle.update import run_updates

    config = load_config({"optimizer": optimizer, "schedule": {"name": "constant", "hyper": hyper},
                          "precision": {"dtype": "float64"}})
    window = [{"g": {"w": np.ones(2)}, "count": 1.0, "poison": 1.0}]
    with pytest.raises(ConfigError, match=message):
        run_updates(config, {"w": np.zeros(2)}, [window] * 3)


@pytest.mark.parametrize(("optimizer", "hyper"), [
    ({"name": "ademamix", "alpha": 2.0}, {"alpha": {"name": "linear", "start_factor": 1.5, "total_iters": 3}}),
    ({"name": "sgd", "momentum": 0.9, "dampening": 0.5}, {"dampening": {"name": "linear", "start_factor": 2.0,
                                                                        "total_iters": 3}}),
    ({"name": "rmsprop", "alpha": 0.5}, {"alpha": {"name": "linear", "start_factor": 2.0, "total_iters": 3}}),
])
def test_values_inside_the_fields_range_are_taken(optimizer: dict, hyper: dict) -> None:
    # control for the ceilings above: AdEMAMix's alpha has none, and reaching exactly 1 is allowed
    from conformance.oracle.update import run_updates

    config = load_config({"optimizer": optimizer, "schedule": {"name": "constant", "hyper": hyper},
                          "precision": {"dtype": "float64"}})
    window = [{"g": {"w": np.ones(2)}, "count": 1.0, "poison": 1.0}]
    assert len(run_updates(config, {"w": np.zeros(2)}, [window] * 3)["params"]) == 3


def test_cycled_momentum_and_a_momentum_schedule_are_refused_together() -> None:
    from conformance.rules.schedules import check_schedule

    config = load_config({"optimizer": {"name": "sgd", "momentum": 0.9},
                          "schedule": {"name": "onecycle", "total_steps": 10, "hyper": {"momentum": WARMUP}}})
    with pytest.raises(ConfigError, match="schedule.cycle_momentum both set momentum"):
        check_schedule(config.schedule, config.optimizer, 10)


@pytest.mark.parametrize("backend", ["torch", "jax", "oracle"])
def test_schedule_values_give_the_recipes_formula(backend: str) -> None:
    # modded-nanogpt: frac = min(t / 10, 1); momentum = (1 - frac)·0.85 + frac·0.95 (Muon's groups only),
    # and the weight decay of every group times the lr's cosine factor (1 + cos(pi·t / T)) / 2
    module = "conformance.oracle.schedules" if backend == "oracle" else f"ref_{backend}.schedules"
    values = importlib.import_module(module).schedule_values
    config = _config()
    with _numerics(backend):
        got = values(config.schedule, config.optimizer, 30)["hyper"]
    t = np.arange(30.0)
    frac = np.minimum(t / 10, 1.0)
    momentum = got["momentum"]
    assert momentum.shape == (30, 2) and np.isnan(momentum[:, 1]).all()  # the AdamW fallback has no momentum
    # torch's LinearLR multiplies the value by a ratio at each of 10 steps (about 20 roundings of
    # 1.1e-16 each, 2.2e-15 at most; measured 4.7e-16): 1e-14 leaves a margin of 4.5
    np.testing.assert_allclose(momentum[:, 0], (1 - frac) * 0.85 + frac * 0.95, rtol=1e-14)
    factor = (1 + np.cos(np.pi * t / UPDATES)) / 2
    # 1 + cos(pi·t/T) cancels near the trough: cos's error of ~1 ulp of 1 on either side (2 × 2.2e-16;
    # the reference here and torch's and JAX's formulas cancel, the oracle's half-angle form does not)
    # over the smallest nonzero 1 + cos, 0.034 at t = 11 and 13, is 1.3e-14 relative (measured 6.5e-15,
    # JAX at t = 13); at t = 12 both sides are exactly 0, so no atol
    np.testing.assert_allclose(got["weight_decay"], np.outer(factor, [0.01, 0.05]), rtol=3e-14, atol=0)


def _numerics(backend: str) -> Any:
    import contextlib

    if backend != "jax":
        return contextlib.nullcontext()
    from ref_jax.backend import context
    return context()


@pytest.mark.parametrize("path", HYPER_CASES, ids=lambda p: p.stem)
def test_each_case_fails_without_its_hyper_schedule(path: Path) -> None:
    # negative control: the expected values need the scheduled hyper-parameters
    from conformance.oracle.update import run_updates

    data = tomllib.loads(path.read_text())
    case = load_case(path)
    grads = data["inputs"]["grads"]
    windows = [[{"g": g, "count": 1.0, "poison": 1.0}] for g in grads]
    params = {k: np.asarray(v, np.float64) for k, v in data["inputs"]["params"].items()}
    tables = {k: data[k] for k in ("optimizer", "schedule") if k in data}
    for keep in (True, False):
        schedule = tables["schedule"] if keep else {k: v for k, v in tables["schedule"].items() if k != "hyper"}
        config = load_config({**tables, "schedule": schedule, "precision": {"dtype": "float64"}})
        got = run_updates(config, params, windows)["params"][-1]
        worst = max(float(np.max(np.abs(got[k] - np.asarray(data["expected"]["params"][-1][k])))) for k in got)
        assert (worst < 1e-12) is keep, (case.id, keep, worst)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, persistent_xla_cache: Any, one_thread: Any) -> dict:
    """Each trainer's uninterrupted run of RECIPE, every checkpoint kept."""
    tmp = tmp_path_factory.mktemp("hyper")
    config = tmp / "run.toml"
    config.write_text(tomlio.dumps(RECIPE))
    out: dict[str, Path] = {"config": config}
    for name in FRAMEWORKS:
        train(name, load_config(RECIPE), tmp / name)
        out[name] = tmp / name
    return out


def test_both_trainers_run_the_warm_up_alike(runs: dict, tmp_path: Path) -> None:
    result = compare_runs(runs["torch"], runs["jax"])
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    # control: without the hyper schedules the weights are not the same run's
    train("torch", _config(hyper=None), tmp_path / "plain")
    assert differences(runs["torch"], tmp_path / "plain", UPDATES) != []


KEYS = {  # the keys beyond momentum / betas / weight decay, on both trainers
    "ademamix-beta3-alpha": ({"name": "ademamix", "lr": 3e-3, "beta3": 0.99, "alpha": 4.0, "alpha_warmup": 4,
                              "beta3_warmup": 3},
                             {"beta3": {"name": "linear", "start_factor": 0.95, "total_iters": 6},
                              "alpha": {"name": "cosine", "t_max": 8}}),
    "rmsprop-alpha-eps": ({"name": "rmsprop", "lr": 3e-3, "alpha": 0.9, "eps": 1e-4, "centered": True},
                          {"alpha": {"name": "linear", "start_factor": 0.9, "total_iters": 5},
                           "eps": {"name": "exponential", "gamma": 0.5}}),
    "sgd-dampening": ({"name": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.6},
                      {"dampening": {"name": "cosine", "t_max": 8}}),
}


@pytest.mark.parametrize("name", sorted(KEYS))
def test_both_trainers_schedule_eps_alpha_beta3_and_dampening_alike(name: str, tmp_path: Path) -> None:
    optimizer, hyper = KEYS[name]
    recipe = {**RECIPE, "optimizer": optimizer, "checkpoint": {"every": 0},
              "schedule": {"name": "constant", "hyper": hyper}, "run": {**RECIPE["run"], "max_updates": 8}}
    plain = {**recipe, "schedule": {"name": "constant"}}
    for framework in FRAMEWORKS:
        train(framework, load_config(recipe), tmp_path / framework)
    train("torch", load_config(plain), tmp_path / "plain")
    result = compare_runs(tmp_path / "torch", tmp_path / "jax")
    assert result.passed, describe_failure(result.first_failure) if result.first_failure else result.problems
    assert not compare_runs(tmp_path / "plain", tmp_path / "jax").passed  # control: the schedules matter


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_killed_inside_a_warm_up_update_resumes_bit_exact(runs: dict, tmp_path: Path, framework: str) -> None:
    out = tmp_path / "run"
    name, point = INSIDE[framework]
    cmd = [*fault_args(name, **point), "train", str(runs["config"]), "--backend", framework, "--out", str(out),
           "--progress", "none"]
    done = run_process(cmd, "die inside update 8", PROCESS_S, capture_output=True, text=True, env=child_env())
    assert done.returncode == 137, done.stderr[-2000:]  # killed as SIGKILL would, inside update 8
    assert [u for u, _ in ck.list_checkpoints(out / "checkpoints")][0] == CUT  # newest first
    train(framework, load_config(RECIPE), out, resume=True)
    assert differences(runs[framework], out, UPDATES) == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_resume_that_loses_the_warm_up_is_caught(runs: dict, tmp_path: Path, framework: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if framework == "torch":  # planted: the hyper schedules rebuilt at update 0, not at the checkpoint's
        import ref_torch._steps as steps
        real = steps.build_hyper
        monkeypatch.setattr(steps, "build_hyper", lambda spec, opt, sched, per, start: real(spec, opt, sched, per, 0))
    else:  # planted: the jitted step reads no hyper table
        import ref_jax._train_step as step
        monkeypatch.setattr(step, "hyper_bases", lambda schedule, optimizer: {})
    out = cut_after(runs[framework], tmp_path / "cut", CUT)
    train(framework, load_config(RECIPE), out, resume=True)
    assert differences(runs[framework], out, UPDATES) != []


def test_the_schedule_command_reports_and_draws_each_hyper_parameter(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from conformance.cli import main

    path = tmp_path / "recipe.toml"
    path.write_text(tomlio.dumps(RECIPE))
    assert main(["schedule", str(path), "--steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "momentum: default 0.85 → 0.95 (lowest 0.85, highest 0.95)\n" in out  # Muon's group only
    assert "weight_decay: default 0.01 → " in out and "default.fallback 0.05 → " in out
    worst = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if line.startswith("max |momentum")]
    assert len(worst) == 1 and worst[0] < 1e-15
    assert main(["plot", "schedule", str(path), "--steps", "30", "-o", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s.png").stat().st_size > 10_000


SCHEDULE_CASES = sorted((ROOT / "conformance" / "cases" / "schedule" / "hyper").glob("*.toml"))


def test_the_generator_reproduces_the_hyper_schedule_cases(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_hyper", ROOT / "tools" / "gen_hyper_schedule_cases.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    written = gen.generate(tmp_path)
    assert sorted(p.name for p in written) == [p.name for p in SCHEDULE_CASES]
    assert all(p.read_text() == (tmp_path / p.name).read_text() for p in SCHEDULE_CASES)


@pytest.mark.parametrize("path", SCHEDULE_CASES, ids=lambda p: p.stem)
@pytest.mark.parametrize("backend", ["torch", "jax", "oracle"])
def test_a_hyper_value_one_update_late_fails_the_schedule_case(path: Path, backend: str, tmp_path: Path) -> None:
    # negative control: the expected hyper values shifted by one update (an off-by-one in the counting)
    from conformance.harness.backends import Backend
    from conformance.harness.runner import run_case

    data = tomllib.loads(path.read_text())
    assert run_case(load_case(path), Backend(backend)).passed
    for key, rows in data["expected"]["hyper"].items():
        shifted = tmp_path / f"{key}.toml"
        late = {**data, "expected": {**data["expected"], "hyper": {**data["expected"]["hyper"],
                                                                   key: [rows[0], *rows[:-1]]}}}
        shifted.write_text(tomlio.dumps(late))
        assert not run_case(load_case(shifted), Backend(backend)).passed, key
