"""`twinstep port CONFIG --to torch|optax`: the generated snippets import no twinstep, run, and reproduce
the spec. Each snippet is exec'd in a fresh namespace (one in a fresh interpreter) and driven over a
gradient stream with accumulation windows and injected non-finite updates; its parameters, lrs, skip
decisions and loss scales must equal twinstep's torch backend at every update (float64: 1e-12 abs,
1e-10 rel); `--check` and tests/test_negative_port.py compare the optax snippet with the JAX backend."""

from __future__ import annotations

import ast
import sys

import numpy as np
import pytest
from support.processes import PROCESS_S, run_process
import torch

from conformance.config import Config, load_config
from conformance.harness.backends import Backend
from conformance.port import from_torch
from conformance.port.verify.traces import (
    compare,
    float64_variant,
    gradient_stream,
    run_backend,
    run_snippet,
    self_check,
)
from conformance.port.write.optax_code import optax_code
from conformance.port.write.torch_code import torch_code
from conformance.rules.groups import resolve_groups

SHAPES = {"enc.weight": (3, 4), "enc.bias": (3,), "head.weight": (2, 3), "head.bias": (2,)}
F64 = {"dtype": "float64"}
DYNAMIC = {"dtype": "float64", "loss_scale": "dynamic", "init_scale": 1024.0, "growth_interval": 2}
STEP = {"name": "step", "step_size": 2, "gamma": 0.5}
GROUP = [{"params": ["*.bias"], "lr": 0.02}]

OPTIMIZERS = {
    "sgd-dampening": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.01},
    "sgd-nesterov-maximize": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True, "maximize": True},
    "adam-amsgrad-l2": {"name": "adam", "lr": 0.01, "amsgrad": True, "weight_decay": 0.1},
    "adam-eps-root": {"name": "adam", "lr": 0.01, "eps_root": 1e-8, "eps": 1e-3},
    "adamw-amsgrad-optax": {"name": "adamw", "lr": 0.01, "amsgrad": True, "amsgrad_variant": "optax"},
    "adamw-amsgrad-raw": {"name": "adamw", "lr": 0.01, "amsgrad": True, "amsgrad_variant": "optax_raw"},
    "rmsprop-centered-momentum": {"name": "rmsprop", "lr": 0.01, "momentum": 0.5, "centered": True},
    "rmsprop-eps-in-sqrt": {"name": "rmsprop", "lr": 0.01, "eps_in_sqrt": True, "alpha": 0.9, "eps": 1e-3},
    "adagrad-decay": {"name": "adagrad", "lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1},
    "adagrad-eps-in-sqrt": {"name": "adagrad", "lr": 0.1, "eps_in_sqrt": True, "eps": 1e-3, "lr_decay": 0.05},
    "adamax": {"name": "adamax", "lr": 0.01, "weight_decay": 0.1},
    "nadam": {"name": "nadam", "lr": 0.01, "weight_decay": 0.1},
    "nadamw-no-schedule": {"name": "nadam", "lr": 0.01, "momentum_schedule": False, "decoupled_weight_decay": True,
                           "weight_decay": 0.1},
    "radam": {"name": "radam", "lr": 0.01, "betas": [0.9, 0.9], "weight_decay": 0.1},
    "lion": {"name": "lion", "lr": 0.01, "weight_decay": 0.1},
    "adafactor": {"name": "adafactor", "lr": 0.01, "weight_decay": 0.1},
    "muon-bfloat16": {"name": "muon", "lr": 0.01},
    "muon-float64": {"name": "muon", "lr": 0.01, "ns_dtype": "float64", "fallback": {"name": "sgd", "lr": 0.1}},
    "sgd-decoupled": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.1, "decoupled_weight_decay": True},
    "rmsprop-decoupled": {"name": "rmsprop", "lr": 0.01, "weight_decay": 0.2, "decoupled_weight_decay": True,
                          "eps_in_sqrt": True},
    "adagrad-decoupled": {"name": "adagrad", "lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1,
                          "decoupled_weight_decay": True},
    "adamax-decoupled": {"name": "adamax", "lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True},
    "adam-eps-hat": {"name": "adam", "lr": 0.01, "eps": 0.1, "eps_hat": True, "weight_decay": 0.1},
    "adamw-eps-hat-amsgrad": {"name": "adamw", "lr": 0.01, "eps": 0.1, "eps_hat": True, "amsgrad": True},
    "schedule-free-adamw": {"name": "schedule_free_adamw", "lr": 0.01, "warmup_steps": 3, "weight_decay": 0.1},
    "schedule-free-sgd": {"name": "schedule_free_sgd", "lr": 0.1, "warmup_steps": 2, "weight_lr_power": 1.0},
    "lion-cautious": {"name": "lion", "lr": 0.01, "weight_decay": 0.1, "cautious": True, "maximize": True},
    "ademamix": {"name": "ademamix", "lr": 0.01, "alpha": 5.0, "beta3": 0.999, "weight_decay": 0.1},
    "prodigy": {"name": "prodigy", "d0": 1e-3, "weight_decay": 0.1, "use_bias_correction": True, "growth_rate": 1.5},
    "prodigy-l2-beta1-zero": {"name": "prodigy", "d0": 1e-3, "betas": [0.0, 0.99], "weight_decay": 0.1,
                              "decouple": False, "safeguard_warmup": True, "d_coef": 2.0},
    "ademamix-warmups": {"name": "ademamix", "lr": 0.01, "alpha": 5.0, "alpha_warmup": 3, "beta3_warmup": 4,
                         "groups": [{"params": ["*.bias"], "alpha": 1.0, "beta3_warmup": 2}]},
}
SCHEDULES = {
    "constant-factor": {"name": "constant", "factor": 0.5, "total_iters": 3},
    "multistep": {"name": "multistep", "milestones": [2, 5], "gamma": 0.3},
    "exponential": {"name": "exponential", "gamma": 0.9},
    "cosine-past-t-max": {"name": "cosine", "t_max": 4, "eta_min": 1e-3},
    "linear": {"name": "linear", "start_factor": 0.2, "end_factor": 0.9, "total_iters": 4},
    "polynomial": {"name": "polynomial", "total_iters": 6, "power": 2.0},
    "onecycle": {"name": "onecycle", "total_steps": 12, "pct_start": 0.25},
    "onecycle-3-linear": {"name": "onecycle", "total_steps": 12, "pct_start": 0.25, "three_phase": True,
                          "anneal_strategy": "linear"},
    "restarts": {"name": "cosine_restarts", "t_0": 2, "t_mult": 2, "eta_min": 1e-3},
    "warmup-cosine-optax": {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 8, "eta_min": 1e-4},
    "warmup-cosine-torch": {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 8, "eta_min": 1e-4,
                            "convention": "torch", "start_factor": 0.1},
    "inverse-sqrt": {"name": "inverse_sqrt", "warmup_steps": 3},
    "wsd-1-sqrt": {"name": "wsd", "warmup_steps": 2, "total_steps": 9, "decay_steps": 4, "decay_type": "1-sqrt"},
    "sequential": {"name": "sequential", "milestones": [3, 6], "schedulers": [
        {"name": "linear", "start_factor": 0.1, "total_iters": 3}, {"name": "wsd", "warmup_steps": 1,
        "total_steps": 4, "decay_steps": 2, "decay_type": "cosine"}, {"name": "exponential", "gamma": 0.8}]},
    "per-epoch": {"name": "step", "step_size": 2, "gamma": 0.5, "unit": "epoch"},
    "chained": {"name": "chained", "schedulers": [{"name": "linear", "start_factor": 0.2, "total_iters": 3},
                                                  {"name": "step", "step_size": 4, "gamma": 0.5},
                                                  {"name": "cosine", "t_max": 20}]},
    "cyclic-triangular2-momentum": {"name": "cyclic", "max_lr": 0.3, "step_size_up": 2, "step_size_down": 3,
                                    "mode": "triangular2"},
    "cyclic-exp-range": {"name": "cyclic", "max_lr": 0.3, "step_size_up": 3, "mode": "exp_range", "gamma": 0.9,
                         "cycle_momentum": False},
    "plateau": {"name": "reduce_on_plateau", "patience": 1},
    "restarts-m-mul": {"name": "cosine_restarts", "t_0": 2, "t_mult": 2, "m_mul": 0.5, "eta_min": 1e-3},
    "polynomial-end": {"name": "polynomial", "total_iters": 6, "power": 2.0, "end_factor": 0.3},
    "exponential-floor": {"name": "exponential", "gamma": 0.7, "end_factor": 0.2},
    "step-ceiling": {"name": "step", "step_size": 2, "gamma": 1.5, "end_factor": 3.0},
    "linear-from-above": {"name": "linear", "start_factor": 4.0, "end_factor": 1.0, "total_iters": 5},
    "tabulated": {"name": "tabulated", "factors": [0.2, 1.0, 0.7, 0.35, 0.1]},
    "sequential-tabulated": {"name": "sequential", "milestones": [3], "schedulers": [
        {"name": "linear", "start_factor": 0.1, "total_iters": 3}, {"name": "tabulated", "factors": [1.0, 0.5, 0.25]}]},
    "warmup-cosine-from-above": {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 9, "start_factor": 3.0},
}
PATHS = {  # clip, accumulation, precision
    "tokens-dynamic-torch-clip": ({"max_norm": 0.5}, {"steps": 3, "normalize": "tokens"}, DYNAMIC),
    "optax-clip-advance": ({"max_norm": 0.5, "eps": 0.0}, {"steps": 2}, {**DYNAMIC, "schedule_on_skip": "advance"}),
    "p1-norm-eps": ({"max_norm": 0.5, "eps": 1e-3, "norm_type": 1.0}, {"steps": 1}, F64),
    "inf-norm-optax": ({"max_norm": 0.5, "eps": 0.0, "norm_type": "inf"}, {"steps": 1}, F64),
    "per-parameter": ({"max_norm": 0.5, "per_parameter": True}, {"steps": 2, "normalize": "tokens"}, F64),
    "value": ({"clip_value": 0.3}, {"steps": 2}, {**F64, "schedule_on_skip": "advance"}),
    "value-then-norm": ({"clip_value": 0.3, "max_norm": 0.5}, {"steps": 2}, F64),
    "value-then-norm-optax": ({"clip_value": 0.3, "max_norm": 0.5, "eps": 0.0}, {"steps": 1}, F64),
    "value-then-per-parameter-eps": ({"clip_value": 0.3, "max_norm": 0.4, "per_parameter": True, "eps": 1e-3},
                                     {"steps": 1}, F64),
    # clip.target = "updates": the step clipped (AdamW's ~0.05 per element: every rule is active)
    "updates-norm-dynamic": ({"max_norm": 0.05, "target": "updates"}, {"steps": 2}, DYNAMIC),
    "updates-value-then-norm-optax": ({"clip_value": 0.01, "max_norm": 0.05, "eps": 0.0, "target": "updates"},
                                      {"steps": 1}, F64),
    "updates-per-parameter": ({"max_norm": 0.02, "per_parameter": True, "target": "updates"}, {"steps": 1}, F64),
}


def _config(optimizer: dict, schedule: dict = STEP, clip: dict | None = None, acc: dict | None = None,
            precision: dict = F64, no_decay: bool = False) -> Config:
    # muon routes by shape; prodigy's optax snippet is one group (one d spans them all: tests/test_prodigy.py)
    opt = {**optimizer, "groups": GROUP} if optimizer["name"] not in ("muon", "prodigy") else dict(optimizer)
    if no_decay:
        opt["no_weight_decay"] = ["head.*"]
    return load_config({"optimizer": opt, "schedule": schedule, "clip": clip or {}, "accumulation": acc or {},
                        "precision": precision})


def _values(config: Config) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {k: rng.normal(size=s) for k, s in SHAPES.items()}


def check_both(config: Config, updates: int = 9, upe: int = 1, poison: tuple[int, ...] = (2, 5, 6),
               atol: float = 1e-12, rtol: float = 1e-10) -> None:
    values = _values(config)
    windows = gradient_stream(SHAPES, updates, micro=config.accumulation.steps, poison=poison,
                              last=1 if config.accumulation.steps > 1 else None)
    with Backend("torch").context():  # the reference: twinstep's torch backend (test_port_torch.py
        want = run_backend("torch", config, values, windows, updates_per_epoch=upe)  # ties it to JAX's)
    for framework, backend, make in (("torch", "torch", torch_code), ("optax", "jax", optax_code)):
        with Backend(backend).context():
            got = run_snippet(framework, make(config, "test", upe), config, values, windows)
        err, message = compare(got, want, atol, rtol)
        assert message is None, f"{framework} snippet: {message}"


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_snippets_reproduce_every_optimizer(name: str) -> None:
    check_both(_config(OPTIMIZERS[name], no_decay=name.startswith(("adamw", "lion"))), poison=())


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_snippets_reproduce_every_schedule(name: str) -> None:
    opt = {"name": "sgd", "lr": 0.1, "momentum": 0.9} if "onecycle" not in name or "3" in name else \
        {"name": "adamw", "lr": 0.01}
    check_both(_config(opt, SCHEDULES[name]), updates=12, upe=3 if name == "per-epoch" else 1, poison=())


@pytest.mark.parametrize("name", sorted(PATHS))
def test_snippets_reproduce_clipping_accumulation_and_loss_scaling(name: str) -> None:
    clip, acc, precision = PATHS[name]
    check_both(_config({"name": "adamw", "lr": 0.05, "weight_decay": 0.1}, clip=clip, acc=acc, precision=precision,
                       no_decay=True))


def test_snippets_run_float16_with_loss_scaling() -> None:
    # float16 compute, float32 master weights, GradScaler's 2^16: the torch snippet is torch's own
    # autocast + GradScaler path (float32 tolerance); the optax snippet casts the parameters to float16
    # for the forward pass as twinstep's JAX policy does, so its gradients carry float16 rounding
    config = _config({"name": "adamw", "lr": 0.05}, clip={"max_norm": 1.0}, acc={"steps": 2},
                     precision={"dtype": "float16", "growth_interval": 3})
    assert config.precision.dynamic_scaling
    values = _values(config)
    windows = gradient_stream(SHAPES, 7, micro=2, poison=(3,), scale=1e-3)
    with Backend("torch").context():
        want = run_backend("torch", config, values, windows)
        assert compare(run_snippet("torch", torch_code(config), config, values, windows), want, 1e-6, 1e-5)[1] is None
    with Backend("jax").context():
        got = run_snippet("optax", optax_code(config), config, values, windows)
    assert compare(got, want, 1e-3, 1e-2)[1] is None  # the CONTRACT's float16 tolerance
    assert got.scales == want.scales and len(set(want.scales)) > 1 and want.skipped[3]  # grew, backed off


@pytest.mark.parametrize("framework", ["torch", "optax"])
def test_the_non_finite_policy_raises_in_snippets(framework: str) -> None:
    values = _values(None)
    for precision, at in (({"dtype": "float64", "on_nonfinite": "raise"}, 2),
                          ({"dtype": "float64", "max_consecutive_skips": 1}, 3)):
        config = _config({"name": "sgd", "lr": 0.1}, precision=precision)
        windows = gradient_stream(SHAPES, 5, poison=[2, 3, 4])
        code = (torch_code if framework == "torch" else optax_code)(config)
        with Backend("torch" if framework == "torch" else "jax").context():
            with pytest.raises(FloatingPointError, match="non-finite"):
                run_snippet(framework, code, config, values, windows)
            run_snippet(framework, code, config, values, windows[:at])  # the updates before pass


@pytest.mark.parametrize("min_lr", [4e-3, [4e-3, 0.05]], ids=["one-floor", "a-floor-per-group"])
def test_plateau_snippets_observe_metrics(min_lr) -> None:
    """reduce_on_plateau in snippets: the torch Updater's observe() (torch's ReduceLROnPlateau.step) and
    the optax snippet's observe(state, plateau, metric) give the lrs of twinstep's torch backend."""
    config = _config({"name": "sgd", "lr": 0.1, "momentum": 0.9}, {"name": "reduce_on_plateau", "patience": 1,
                                                                   "cooldown": 1, "factor": 0.5, "min_lr": min_lr})
    metrics = [1.0, 0.9, 0.95, 0.93, 0.92, 0.91, 0.95, 0.99, 0.89, 0.9, 0.9, 0.9]
    with Backend("torch").context():
        want = Backend("torch").function("schedules", "schedule_values")(config.schedule, config.optimizer,
                                                                          len(metrics), metrics=metrics)["lr"]
    ns: dict = {}
    exec(torch_code(config), ns)  # noqa: S102 - the generated code under test
    model = torch.nn.Module()
    for name, shape in SHAPES.items():
        model.register_parameter(name.replace(".", "_"), torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64)))
    updater, torch_lrs = ns["Updater"](model), []
    for m in metrics:
        torch_lrs.append([g["lr"] for g in updater.optimizer.param_groups])
        updater.observe(m)
    np.testing.assert_array_equal(np.array(torch_lrs), want)
    ns = {}
    with Backend("jax").context():
        exec(optax_code(config), ns)  # noqa: S102
        state, plateau, optax_lrs = ns["init"](_values(config)), ns["plateau_init"](), []
        for m in metrics:
            optax_lrs.append([float(state.opt_state.hyperparams[f"lr_{i}"]) for i in range(2)])
            state, plateau = ns["observe"](state, plateau, m)
    np.testing.assert_array_equal(np.array(optax_lrs), want)
    assert len(set(want[:, 0])) > 2


def test_snippets_import_no_twinstep() -> None:
    config = _config(OPTIMIZERS["muon-float64"], SCHEDULES["sequential"], *PATHS["tokens-dynamic-torch-clip"])
    for code in (torch_code(config), optax_code(config)):
        tree = ast.parse(code)
        modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert modules <= {"fnmatch", "math", "typing", "torch", "jax", "optax"}, modules


@pytest.mark.parametrize("seed", [0, 1])
def test_a_torch_snippet_runs_in_a_fresh_interpreter(tmp_path, seed: int) -> None:
    """The warm-up's first lr is 0 (optax's convention), so the first update leaves the loss as it was;
    every later one lowers it. Seeded: the model's initial weights are torch's default init."""
    config = _config(OPTIMIZERS["adam-amsgrad-l2"], SCHEDULES["warmup-cosine-optax"], *PATHS["p1-norm-eps"][:2])
    script = torch_code(config) + f'''
torch.manual_seed({seed})
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)).double()
updater = Updater(model)
# a target far from any initial output, so every update (lr > 0 after the first) moves towards it
x, y = torch.ones(5, 4, dtype=torch.float64), torch.full((5, 1), 3.0, dtype=torch.float64)
losses = [updater([(x, y)], torch.nn.functional.mse_loss)["loss"] for _ in range(6)]
assert losses[0] == losses[1] and all(a > b for a, b in zip(losses[1:], losses[2:])), losses
print("ok", losses[-1])
'''
    path = tmp_path / "snippet.py"
    path.write_text(script)
    out = run_process([sys.executable, str(path)], "run the snippet", PROCESS_S, capture_output=True, text=True,
                      cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr


@pytest.mark.parametrize("name", ["sgd-dampening", "adam-amsgrad-l2", "rmsprop-centered-momentum", "nadam",
                                  "adafactor"])
def test_torch_snippet_objects_translate_back_to_the_same_spec(name: str) -> None:
    config = _config(OPTIMIZERS[name], SCHEDULES["warmup-cosine-torch"])
    ns: dict = {}
    exec(torch_code(config), ns)  # noqa: S102 - the generated code under test
    named = {k: torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for k, s in SHAPES.items()}
    opt = ns["build_optimizer"](named.items())
    back = load_config({**from_torch(opt, ns["build_scheduler"](opt), named), "precision": F64})
    assert back.schedule == config.schedule
    shapes = {k: tuple(s) for k, s in SHAPES.items()}
    per_param = lambda c: {n: dict(g.hyperparams) for g in resolve_groups(c.optimizer, shapes) for n in g.names}  # noqa: E731
    assert per_param(back) == per_param(config)


def test_self_check_runs_the_float64_variant() -> None:
    config = load_config({"optimizer": {"name": "adamw"}, "precision": {"dtype": "float16"}})
    assert float64_variant(config).precision.dynamic_scaling  # the loss-scale path stays under test
    err, message, n = self_check(config, "torch", lambda c: torch_code(c))
    assert message is None and err <= 1e-12 and n == 8


def test_to_code_is_the_python_entry_point() -> None:
    from conformance.errors import ConfigError
    from conformance.port import to_code

    config = _config(OPTIMIZERS["lion"])
    assert to_code(config, "torch") == torch_code(config) and to_code(config, "optax") == optax_code(config)
    with pytest.raises(ConfigError, match="framework must be 'torch' or 'optax'"):
        to_code(config, "tensorflow")


def test_snippets_keep_the_weights_ema() -> None:
    """[ema] in both snippets (torch: AveragedModel with get_ema_multi_avg_fn; optax: the state's
    ema): after every update, the oracle's rule over the snippet's own weights, skipped updates
    (poisoned windows) changing nothing."""
    from conformance.oracle.ema import update_ema
    from conformance.rules.ema import ema_due

    config = load_config({"optimizer": {"name": "adamw", "lr": 0.05}, "precision": F64,
                          "ema": {"decay": 0.8, "every": 2, "start": 1}})
    values = _values(config)
    windows = gradient_stream(SHAPES, 8, poison=(3,))
    for framework, backend, make in (("torch", "torch", torch_code), ("optax", "jax", optax_code)):
        with Backend(backend).context():
            trace = run_snippet(framework, make(config, "test", 1), config, values, windows)
        average = None
        for t, (params, skipped, got) in enumerate(zip(trace.params, trace.skipped, trace.ema)):
            if not skipped and ema_due(config.ema, t):
                average = update_ema(config.ema, average, params, t)
            assert (got is None) == (average is None), f"{framework} update {t}"
            for k in params if got is not None else ():
                np.testing.assert_allclose(got[k], average[k], rtol=1e-13, atol=1e-15, err_msg=f"{framework} {t} {k}")
        assert trace.skipped[3] and average is not None
