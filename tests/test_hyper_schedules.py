"""Schedules of hyper-parameters other than the lr (`[schedule.hyper.<key>]`): modded-nanogpt's Muon
momentum warm-up, weight decay that follows the lr, betas that move. The bundled cases
(optimizer/torch-*-warmup, -wd-follows-lr, -beta2-warmup-beta1-decay) pin the update path against
torch.optim with the values set by hand; here: the spec's and the rules' refusals, the values
`schedule_values` reports on each backend against the recipe's own formula, both trainers on one
config with z-loss and a Muon momentum warm-up (float64, equal to 1e-10; a run without the warm-up
is the control), and a real `twinstep train` process killed inside a warm-up update that resumes
bit for bit. Negative controls: each case without its hyper schedule fails; a resume that restarts
the warm-up, or a JAX step that ignores it, is caught.
"""

from __future__ import annotations

import importlib
import tomllib
import warnings
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
    "optimizer": {"name": "muon", "lr": 0.02, "momentum": 0.95, "weight_decay": 0.01,
                  "fallback": {"name": "adamw", "lr": 3e-3, "weight_decay": 0.05}},
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
    ({"hyper": {"eps": {"name": "constant"}}}, "schedule.hyper"),
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
])
def test_the_rules_refuse_a_hyper_schedule_the_optimizer_cannot_take(optimizer: dict, hyper: dict,
                                                                    message: str) -> None:
    from conformance.oracle.update import run_updates

    config = load_config({"optimizer": optimizer, "schedule": {"name": "constant", "hyper": hyper},
                          "precision": {"dtype": "float64"}})
    window = [{"g": {"w": np.ones(2)}, "count": 1.0, "poison": 1.0}]
    with pytest.raises(ConfigError, match=message):
        run_updates(config, {"w": np.zeros(2)}, [window] * 3)


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


SNIPPET_SHAPES = {"enc.weight": (3, 4), "enc.bias": (3,), "head.weight": (2, 3), "head.bias": (2,)}
SNIPPETS = {
    "muon-momentum-warmup-wd": ({"name": "muon", "lr": 0.02, "momentum": 0.95, "weight_decay": 0.01},
                                {"name": "cosine", "t_max": 9, "hyper": {"momentum": WARMUP, "weight_decay": {
                                    "name": "cosine", "t_max": 9}}}, {"steps": 2}),
    "adam-betas-per-epoch": ({"name": "adam", "lr": 0.01, "betas": [0.9, 0.99],
                              "groups": [{"params": ["*.bias"], "betas": [0.8, 0.95]}]},
                             {"name": "step", "step_size": 2, "unit": "epoch", "hyper": {
                                 "beta1": {"name": "exponential", "gamma": 0.9},
                                 "beta2": {"name": "linear", "start_factor": 0.9, "total_iters": 2}}}, {"steps": 1}),
    "sgd-plateau-momentum": ({"name": "sgd", "lr": 0.05, "momentum": 0.9},
                             {"name": "reduce_on_plateau", "hyper": {"momentum": {"name": "tabulated",
                                                                                 "factors": [0.5, 0.8, 1.0]}}},
                             {"steps": 2}),
}


@pytest.mark.parametrize("framework", ["torch", "optax"])
@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_the_snippets_set_the_scheduled_hyper_parameters(name: str, framework: str) -> None:
    from conformance.harness.backends import Backend
    from conformance.port.verify.traces import compare, gradient_stream, run_backend, run_snippet
    from conformance.port.write.optax_code import optax_code
    from conformance.port.write.torch_code import torch_code

    optimizer, schedule, accumulation = SNIPPETS[name]
    upe = 3 if schedule.get("unit") == "epoch" else 1
    rng = np.random.default_rng(3)
    values = {k: rng.normal(size=s) for k, s in SNIPPET_SHAPES.items()}
    windows = gradient_stream(SNIPPET_SHAPES, 9, micro=accumulation["steps"], poison=(4,), last=None)
    configs = {hyper: load_config({"optimizer": optimizer, "accumulation": accumulation, "precision": {"dtype": "float64"},
                                   "schedule": schedule if hyper else {k: v for k, v in schedule.items() if k != "hyper"}})
               for hyper in (True, False)}  # control: the snippet of the config without the hyper schedules
    backend, make = ("torch", torch_code) if framework == "torch" else ("jax", optax_code)
    with Backend(backend).context():
        want = run_backend(backend, configs[True], values, windows, updates_per_epoch=upe)
    results = {}
    for hyper, config in configs.items():
        with Backend(backend).context():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                results[hyper] = run_snippet(framework, make(config, "test", upe), config, values, windows)
            assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]  # the stand-ins are quiet
    assert compare(results[True], want, 1e-12, 1e-10)[1] is None
    assert compare(results[False], want, 1e-12, 1e-10)[1] is not None


def test_training_arguments_refuse_it() -> None:
    from conformance.errors import UnsupportedError
    from conformance.port.write.hf_args import hf_arguments

    with pytest.raises(UnsupportedError, match="schedule.hyper"):
        hf_arguments(load_config({"optimizer": {"name": "adamw"}, "schedule": {"name": "constant", "hyper": {
            "weight_decay": {"name": "linear", "total_iters": 3}}}, "run": {"max_updates": 10}}))


@pytest.mark.parametrize("name", ["torch-sgd-momentum-warmup", "torch-adam-beta2-warmup-beta1-decay",
                                  "torch-adamw-wd-follows-lr"])
def test_optax_inject_hyperparams_is_the_same_math_at_float64_counts(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the optax-native backend schedules b1 / b2 / momentum / weight_decay through inject_hyperparams;
    # the two cases it fails differ only by S-INT32 (optax's schedules of an int32 count are float32):
    # with the count cast to float64 first, optax's own transforms give torch's values
    import jax
    import jax.numpy as jnp

    from natives.optax_native import update as native

    real = native.schedule_fn
    monkeypatch.setattr(native, "schedule_fn", lambda spec, b, n, upe=1: (
        lambda count, fn=real(spec, b, n, upe): fn(jnp.asarray(count, jnp.float64))))
    data = tomllib.loads((ROOT / "conformance" / "cases" / "optimizer" / "update" / f"{name}.toml").read_text())
    windows = [[{"g": g, "count": 1.0, "poison": 1.0}] for g in data["inputs"]["grads"]]
    params = {k: np.asarray(v, np.float64) for k, v in data["inputs"]["params"].items()}
    for keep in (True, False):  # control: without the hyper schedules optax's run is another
        schedule = data["schedule"] if keep else {k: v for k, v in data["schedule"].items() if k != "hyper"}
        config = load_config({"optimizer": data["optimizer"], "schedule": schedule, "precision": {"dtype": "float64"}})
        with jax.enable_x64(True):
            got = native.run_updates(config, params, windows)["params"]
        worst = max(float(np.max(np.abs(got[t][k] - np.asarray(data["expected"]["params"][t][k]))))
                    for t in range(len(windows)) for k in params)
        assert (worst < 1e-14) is keep, (keep, worst)


LINEAR_B1 = {"linear_schedule": {"init_value": 0.85, "end_value": 0.95, "transition_steps": 5}}
OPTAX_WRITTEN = {  # optax.inject_hyperparams(alias)(...) with schedules for other arguments than the lr
    "adamw-b1-warmup-wd-cosine": {"inject_hyperparams": {"adamw": {
        "learning_rate": {"cosine_decay_schedule": {"init_value": 0.05, "decay_steps": 12}}, "b1": LINEAR_B1,
        "weight_decay": {"cosine_decay_schedule": {"init_value": 0.1, "decay_steps": 12}}}}},
    "sgd-momentum-warmup": {"inject_hyperparams": {"sgd": {"learning_rate": 0.1, "nesterov": True, "momentum": {
        "linear_schedule": {"init_value": 0.85, "end_value": 0.95, "transition_steps": 4}}}, "static_args": ["nesterov"]}},
    "adam-b2-exponential": {"inject_hyperparams": {"adam": {"learning_rate": 0.02, "b2": {
        "exponential_decay": {"init_value": 0.999, "transition_steps": 1, "decay_rate": 0.99}}}}},
}


@pytest.mark.parametrize("name", sorted(OPTAX_WRITTEN))
def test_optax_written_with_scheduled_hyper_parameters_ports_exactly(name: str) -> None:
    # the reference is optax itself (conformance.port.verify.native: the same description built into
    # optax's transforms, schedules at float64 counts); control: the spec without its hyper schedules
    from conformance.harness.backends import Backend
    from conformance.port import from_optax
    from conformance.port.verify.native import run_native_optax
    from conformance.port.verify.traces import compare, gradient_stream, run_backend

    spec = from_optax({"optax": OPTAX_WRITTEN[name]})
    assert spec["schedule"]["hyper"]
    values = {k: v * 0.5 for k, v in gradient_stream(SNIPPET_SHAPES, 1, seed=9)[0][0]["g"].items()}
    windows = gradient_stream(SNIPPET_SHAPES, 10)
    with Backend("jax").context():
        want = run_native_optax(OPTAX_WRITTEN[name], values, windows)
    plain = {**spec, "schedule": {k: v for k, v in spec["schedule"].items() if k != "hyper"}}
    for backend in ("torch", "jax"):
        with Backend(backend).context():
            ok = compare(run_backend(backend, load_config({**spec, "precision": {"dtype": "float64"}}), values,
                                     windows), want)[1]
            off = compare(run_backend(backend, load_config({**plain, "precision": {"dtype": "float64"}}), values,
                                      windows), want)[1]
        assert ok is None and off is not None, (backend, ok)


def test_a_schedule_outside_inject_hyperparams_is_refused() -> None:
    from conformance.errors import UnsupportedError
    from conformance.port import from_optax

    with pytest.raises(UnsupportedError, match=r"optax.adam.b1 is a schedule: .* wrap the transform in "
                                               r"inject_hyperparams"):
        from_optax({"optax": {"adam": {"learning_rate": 0.1, "b1": LINEAR_B1}}})


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
