"""Bad schedule settings: one-line errors that name the field, the same class on every backend."""

from __future__ import annotations

import pytest

from conformance.config import load_config
from conformance.errors import ConfigError, InputError
from conformance.harness.backends import Backend
from conformance.rules.schedules import check_run_length

# (schedule table, text the one-line ConfigError must contain)
SPEC_ERRORS = [
    ({"name": "cosine", "t_max": 0}, "schedule.t_max must be in [1, 2^63 - 1]; received 0"),
    ({"name": "cosine"}, "schedule.t_max is required for name = 'cosine'"),
    ({"name": "warmup_cosine", "warmup_steps": 100, "total_steps": 100}, "schedule.warmup_steps must be less than total_steps = 100"),
    ({"name": "wsd", "warmup_steps": 30, "total_steps": 20, "decay_steps": 5}, "schedule.warmup_steps must be less than total_steps = 20"),
    ({"name": "wsd", "warmup_steps": 5, "total_steps": 20, "decay_steps": 16}, "schedule.decay_steps plus warmup_steps (5) must be <= total_steps = 20"),
    ({"name": "multistep", "milestones": [30, 20]}, "schedule.milestones[1] must be greater than milestones[0] = 30"),
    ({"name": "multistep", "milestones": [5, 5]}, "schedule.milestones[1] must be greater than milestones[0] = 5"),
    ({"name": "multistep", "milestones": []}, "schedule.milestones must list at least one update count"),
    ({"name": "multistep", "milestones": [0, 3]}, "schedule.milestones[0] must be in [1, 2^63 - 1]"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 0.0}, "schedule.pct_start must be in (0, 1); received 0.0"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 1.0}, "schedule.pct_start must be in (0, 1); received 1.0"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 1.5}, "schedule.pct_start must be in (0, 1)"),
    ({"name": "onecycle", "total_steps": 3}, "schedule.pct_start times total_steps must be > 1"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 0.6, "three_phase": True}, "schedule.pct_start is too large for three_phase"),
    ({"name": "onecycle", "total_steps": 100, "max_momentum": 1.0}, "schedule.max_momentum must be in [0, 1)"),
    ({"name": "onecycle"}, "schedule.total_steps is required for name = 'onecycle'"),
    ({"name": "step", "step_size": 0}, "schedule.step_size must be in [1, 2^63 - 1]"),
    ({"name": "step", "step_size": 2, "gamma": 0.0}, "schedule.gamma must be > 0"),
    ({"name": "step", "step_size": 2.5}, "schedule.step_size must be a valid integer"),
    ({"name": "exponential"}, "schedule.gamma is required for name = 'exponential'"),
    ({"name": "cosine", "t_max": 10, "eta_min": -1e-3}, "schedule.eta_min must be >= 0"),
    ({"name": "step", "step_size": 2, "t_max": 10}, "schedule.t_max is only used when name is cosine"),
    ({"name": "cosine", "t_max": 10, "warmup": 5}, "schedule.warmup is not a known key"),
    ({"name": "cosin", "t_max": 10}, "(did you mean 'cosine'?)"),
    ({"name": "linear", "start_factor": 0.0}, "schedule.start_factor must be > 0 for linear"),
    ({"name": "linear", "end_factor": -0.5}, "schedule.end_factor must be >= 0"),
    ({"name": "cyclic", "max_lr": 0.1, "mode": "tri"},
     "schedule.mode must be one of 'triangular', 'triangular2', 'exp_range'; received 'tri'"),
    ({"name": "cyclic"}, "schedule.max_lr is required for name = 'cyclic'"),
    ({"name": "cyclic", "max_lr": 0.1, "step_size_up": 0}, "schedule.step_size_up must be in [1, 2^63 - 1]"),
    ({"name": "cyclic", "max_lr": 0.1, "scale_mode": "iterations"},
     "schedule.scale_mode = 'iterations' means nothing with mode = 'triangular'"),
    ({"name": "cyclic", "max_lr": 0.1, "mode": "exp_range", "scale_mode": "cycle"},
     "schedule.scale_mode = 'cycle' means nothing with mode = 'exp_range'"),
    ({"name": "cyclic", "max_lr": 0.1, "gamma": 0.9}, "schedule.gamma = 0.9 means nothing with mode = 'triangular'"),
    ({"name": "cyclic", "max_lr": 0.1, "max_momentum": 1.0}, "schedule.max_momentum must be in [0, 1)"),
    ({"name": "reduce_on_plateau", "mode": "minimum"}, "schedule.mode must be one of 'min', 'max'; received 'minimum'"),
    ({"name": "reduce_on_plateau", "factor": 1.0}, "schedule.factor must be < 1"),
    ({"name": "reduce_on_plateau", "factor": 0.0}, "schedule.factor must be in (0, 1]"),
    ({"name": "reduce_on_plateau", "patience": -1}, "schedule.patience must be in [0, 2^63 - 1]"),
    ({"name": "reduce_on_plateau", "threshold_mode": "relative"}, "schedule.threshold_mode must be one of"),
    ({"name": "reduce_on_plateau", "min_lr": -1.0}, "schedule.min_lr must be >= 0"),
    ({"name": "reduce_on_plateau", "monitor": "loss"}, "schedule.monitor must be one of"),
    ({"name": "reduce_on_plateau", "unit": "epoch"},
     "schedule.unit = 'epoch' means nothing with name = 'reduce_on_plateau'"),
    ({"name": "step", "step_size": 2, "patience": 3}, "schedule.patience is only used when name is reduce_on_plateau"),
    ({"name": "chained", "milestones": [3], "schedulers": [{"name": "constant"}]},
     "schedule.milestones is only used when name is multistep, sequential"),
    ({"name": "chained", "schedulers": []}, "schedule.schedulers must list at least one"),
    ({"name": "chained", "schedulers": [{"name": "cosine_restarts", "t_0": 3}]},
     "schedule.schedulers[0].name cannot be 'cosine_restarts' inside chained: CosineAnnealingWarmRestarts sets"),
    ({"name": "chained", "schedulers": [{"name": "reduce_on_plateau"}]},
     "schedule.schedulers[0].name cannot be 'reduce_on_plateau' inside chained: torch's ChainedScheduler refuses"),
    ({"name": "chained", "schedulers": [{"name": "constant"}, {"name": "cosine", "t_max": 9, "eta_min": 1e-3}]},
     "schedule.schedulers[1].eta_min must be 0 (torch's CosineAnnealingLR anneals lr − eta_min: not a factor)"),
    ({"name": "chained", "schedulers": [{"name": "linear", "start_factor": 2.0}]},
     "schedule.schedulers[0].start_factor must be <= 1"),
    ({"name": "chained", "schedulers": [{"name": "polynomial", "end_factor": 0.1}]},
     "schedule.schedulers[0].end_factor must be 0"),
    ({"name": "sequential", "milestones": [3], "schedulers": [{"name": "constant"}, {"name": "cyclic", "max_lr": 1.0}]},
     "schedule.schedulers[1].name cannot be 'cyclic' inside sequential"),
    ({"name": "tabulated", "factors": []}, "schedule.factors must hold at least one factor"),
    ({"name": "tabulated", "factors": [1.0, -0.5]}, "schedule.factors[1] must be >= 0; received -0.5"),
    ({"name": "tabulated"}, "schedule.factors is required for name = 'tabulated'"),
    ({"name": "cosine", "t_max": 3, "factors": [1.0]}, "schedule.factors is only used when name is tabulated"),
    ({"name": "chained", "schedulers": [{"name": "tabulated", "factors": [1.0]}]},
     "schedule.schedulers[0].name cannot be 'tabulated' inside chained: torch builds it from LambdaLR"),
    ({"name": "cosine_restarts", "t_0": 5, "m_mul": 0.0}, "schedule.m_mul must be > 0"),
    ({"name": "cosine", "t_max": 5, "m_mul": 0.5}, "schedule.m_mul is only used when name is cosine_restarts"),
    ({"name": "exponential", "gamma": 0.9, "end_factor": 1.5}, "schedule.end_factor must be a floor <= 1 for gamma < 1"),
    ({"name": "exponential", "gamma": 1.1, "end_factor": 0.5}, "schedule.end_factor must be a ceiling >= 1"),
    ({"name": "step", "step_size": 2, "gamma": 1.0, "end_factor": 0.5}, "schedule.end_factor means nothing with gamma = 1"),
    ({"name": "cosine", "t_max": 5, "end_factor": 0.5}, "schedule.end_factor is only used when name is linear"),
    ({"name": "constant", "total_iters": 3}, "schedule.total_iters needs factor"),
    ({"name": "constant", "factor": 0.0}, "schedule.factor must be in (0, 1]"),
    ({"name": "inverse_sqrt", "warmup_steps": 0}, "schedule.timescale is required when warmup_steps = 0"),
    ({"name": "cosine_restarts", "t_0": 5, "t_mult": 0}, "schedule.t_mult must be in [1, 2^63 - 1]"),
    ({"name": "sequential", "milestones": [5, 10], "schedulers": [{"name": "constant"}, {"name": "constant"}]},
     "schedule.milestones must have one entry fewer than schedulers"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "constant"}, {"name": "onecycle", "total_steps": 9}]},
     "schedule.schedulers[1].name cannot be 'onecycle' inside sequential"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "constant"}, {"name": "sequential", "schedulers": [{"name": "constant"}]}]},
     "schedule.schedulers[1].name cannot be 'sequential' inside sequential"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "constant"}, {"name": "chained", "schedulers": [{"name": "constant"}]}]},
     "schedule.schedulers[1].name cannot be 'chained' inside sequential: torch's SequentialLR restarts a later part"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "chained", "schedulers": [
        {"name": "step", "step_size": 2}, {"name": "exponential", "gamma": 0.9}]}, {"name": "constant"}]},
     "schedule.schedulers[0].schedulers[1].name cannot be 'exponential' in a chained first part of sequential"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "constant", "unit": "epoch"}, {"name": "constant"}]},
     "schedule.schedulers[0].unit must equal the sequential schedule's unit 'update'"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "cosine", "t_max": 0}, {"name": "constant"}]},
     "schedule.schedulers[0].t_max must be in [1, 2^63 - 1]"),
    ({"name": "sequential", "milestones": [7, 3], "schedulers": [{"name": "constant"}] * 3},
     "schedule.milestones[1] must be greater than milestones[0] = 7"),
]


@pytest.mark.parametrize(("table", "text"), SPEC_ERRORS, ids=[t for _, t in SPEC_ERRORS])
def test_spec_error_is_one_line_naming_the_field(table: dict, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"schedule": table})
    message = str(info.value)
    assert text in message
    assert "\n" not in message and message.startswith("schedule.")


# (optimizer table, schedule table, steps, error class, text): errors raised when values are asked for
RUN_ERRORS = [
    ({"name": "sgd", "lr": 0.1, "groups": [{"params": ["a"], "lr": 0.01}]},
     {"name": "reduce_on_plateau", "min_lr": [1e-3, 1e-4, 1e-5]}, 5, ConfigError,
     "schedule.min_lr lists 3 floors for 2 parameter groups; give one per group in group order"),
    ({"name": "sgd"}, {"name": "onecycle", "total_steps": 10}, 11, ConfigError, "schedule.total_steps = 10 is shorter than the run"),
    ({"name": "adagrad"}, {"name": "onecycle", "total_steps": 10}, 5, ConfigError, "schedule.cycle_momentum = true needs an optimizer"),
    ({"name": "muon"}, {"name": "onecycle", "total_steps": 10}, 5, ConfigError, "schedule.cycle_momentum = true is not supported"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"params": ["a"], "lr": 0.01}]}, {"name": "onecycle", "total_steps": 10, "max_lr": 0.5},
     5, ConfigError, "schedule.max_lr sets every group's lr, but optimizer.groups[0].lr sets its own"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"params": ["a"], "lr": 0.01}]}, {"name": "cyclic", "max_lr": 0.5, "base_lr": 0.01},
     5, ConfigError, "schedule.base_lr sets every group's lr, but optimizer.groups[0].lr sets its own"),
    ({"name": "adagrad"}, {"name": "cyclic", "max_lr": 0.5}, 5, ConfigError,
     "schedule.cycle_momentum = true needs an optimizer with momentum or betas; optimizer.name = 'adagrad'"),
    ({"name": "sgd"}, {"name": "chained", "schedulers": [{"name": "cosine", "t_max": 4}]}, 6, ConfigError,
     "schedule.schedulers[0] (cosine, t_max = 4) inside chained reaches update 5, past t_max"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"params": ["a"], "lr": 0.0}]}, {"name": "wsd", "total_steps": 10, "decay_steps": 5, "eta_min": 1e-3},
     5, ConfigError, "schedule eta_min = 0.001 exceeds the lowest group lr 0.0"),
    ({"name": "sgd", "lr": 1e-3}, {"name": "cosine", "t_max": 4, "eta_min": 0.5}, 5, ConfigError,
     "schedule eta_min = 0.5 is above the lowest group lr 0.001: cosine would anneal the lr up"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"params": ["a"], "lr": 0.01}]},
     {"name": "sequential", "milestones": [2], "schedulers": [{"name": "linear", "total_iters": 2},
                                                              {"name": "cosine_restarts", "t_0": 3, "eta_min": 0.05}]},
     5, ConfigError, "a schedule.schedulers part eta_min = 0.05 is above the lowest group lr 0.01"),
    ({"name": "sgd"}, {"name": "constant"}, 0, InputError, "steps must be an integer >= 1; received 0"),
]
# (schedule table, steps, keyword arguments, text of the InputError): misused at / metrics
INPUT_ERRORS = [
    ({"name": "step", "step_size": 2}, 5, {"metrics": [1.0] * 5},
     "metrics are observed only by schedule.name = 'reduce_on_plateau'; received 5 values for name = 'step'"),
    ({"name": "reduce_on_plateau"}, 5, {"metrics": [1.0] * 4}, "metrics must hold one value per update (5"),
    ({"name": "step", "step_size": 2}, 5, {"at": [3, 1]}, "at[1] = 1 must be greater than at[0] = 3"),
    ({"name": "step", "step_size": 2}, 5, {"at": [1, 5]}, "at must lie in [0, steps = 5); received 5"),
    ({"name": "step", "step_size": 2}, 5, {"at": []}, "at must list at least one update"),
]


@pytest.mark.parametrize(("table", "steps", "kwargs", "text"), INPUT_ERRORS, ids=[r[-1] for r in INPUT_ERRORS])
def test_misused_at_and_metrics_are_the_same_input_error_everywhere(table, steps, kwargs, text) -> None:
    config = load_config({"schedule": table})
    messages = set()
    for name in ("torch", "jax", "oracle"):
        backend = Backend(name)
        with backend.context(), pytest.raises(InputError) as info:
            backend.function("schedules", "schedule_values")(config.schedule, config.optimizer, steps, **kwargs)
        messages.add(str(info.value))
    assert len(messages) == 1 and text in messages.pop()


@pytest.mark.parametrize(("optimizer", "table", "steps", "error", "text"), RUN_ERRORS, ids=[r[-1] for r in RUN_ERRORS])
def test_run_errors_same_class_and_message_on_every_backend(optimizer, table, steps, error, text) -> None:
    config = load_config({"optimizer": optimizer, "schedule": table})
    messages = set()
    for name in ("torch", "jax", "oracle"):
        backend = Backend(name)
        with backend.context(), pytest.raises(error) as info:
            backend.function("schedules", "schedule_values")(config.schedule, config.optimizer, steps)
        assert type(info.value) is error
        messages.add(str(info.value))
    assert len(messages) == 1, messages
    assert text in messages.pop()


def test_updates_per_epoch_needs_unit_epoch(backend) -> None:
    config = load_config({"schedule": {"name": "step", "step_size": 2}})
    with pytest.raises(InputError, match="updates_per_epoch = 3 is only read with schedule.unit = 'epoch'"):
        backend.function("schedules", "schedule_values")(config.schedule, config.optimizer, 5, 3)


@pytest.mark.parametrize(("table", "updates", "text"), [
    ({"name": "warmup_cosine", "warmup_steps": 500, "total_steps": 2000}, 300,
     "schedule.warmup_steps = 500 is longer than the run (300 updates)"),
    ({"name": "inverse_sqrt", "warmup_steps": 50}, 50, "schedule.warmup_steps = 50 is longer than the run"),
    ({"name": "onecycle", "total_steps": 100}, 101, "schedule.total_steps = 100 is shorter than the run (101 updates)"),
])
def test_run_length_errors(table: dict, updates: int, text: str) -> None:
    spec = load_config({"schedule": table}).schedule
    with pytest.raises(ConfigError, match=text.replace("(", r"\(").replace(")", r"\)")):
        check_run_length(spec, updates)


def test_run_length_notes() -> None:
    short = load_config({"schedule": {"name": "cosine", "t_max": 1000}}).schedule
    assert any("stops before reaching its end value" in n for n in check_run_length(short, 500))
    past = load_config({"schedule": {"name": "cosine", "t_max": 100}}).schedule
    assert any("climbs back" in n for n in check_run_length(past, 300))
    assert check_run_length(load_config({"schedule": {"name": "cosine", "t_max": 100}}).schedule, 101) == []
    epochs = load_config({"schedule": {"name": "warmup_cosine", "unit": "epoch", "warmup_steps": 2,
                                       "total_steps": 10}}).schedule
    assert check_run_length(epochs, 30, updates_per_epoch=3) == []  # 10 epochs of 3 updates


CASE = {"id": "schedule/x", "kind": "schedule", "source": "test", "optimizer": {"name": "sgd", "lr": 0.1}}
# ([schedule], [inputs], [expected], text of the CaseError): schedule cases that do not mean what they say
CASE_ERRORS = [
    ({"name": "step", "step_size": 2}, {"steps": 3, "metrics": [1.0, 1.0, 1.0]}, {"lr": [0.1, 0.1, 0.01]},
     "inputs.metrics is read only by schedule.name = 'reduce_on_plateau'"),
    ({"name": "reduce_on_plateau"}, {"steps": 3}, {"lr": [0.1, 0.1, 0.1]}, "inputs.metrics is required"),
    ({"name": "reduce_on_plateau"}, {"steps": 3, "metrics": [1.0, 1.0]}, {"lr": [0.1, 0.1, 0.1]},
     "inputs.metrics must hold one number per update (3)"),
    ({"name": "step", "step_size": 2}, {"steps": 9, "at": [4, 2]}, {"lr": [0.01, 0.1]},
     "inputs.at[1] = 2 must be >= 0 and greater than the update before it"),
    ({"name": "step", "step_size": 2}, {"steps": 3, "at": [0, 5]}, {"lr": [0.1, 0.001]},
     "inputs.at[1] = 5 is not an update of inputs.steps = 3"),
    ({"name": "step", "step_size": 2}, {"at": [0, 5]}, {"lr": [0.1, 0.01, 0.001]},
     "expected.lr has shape (3,); len(inputs.at) = 2"),
    ({"name": "step", "step_size": 2}, {}, {"lr": [0.1]}, "inputs.steps is required (or inputs.at"),
    ({"name": "step", "step_size": 2}, {"steps": 2}, {"lr": [0.1, 0.1], "momentum": [0.9, 0.9]},
     "expected.momentum needs schedule.name = 'onecycle' or 'cyclic'"),
]


@pytest.mark.parametrize(("schedule", "inputs", "expected", "text"), CASE_ERRORS, ids=[r[-1] for r in CASE_ERRORS])
def test_misused_case_inputs_are_one_case_error(tmp_path, schedule, inputs, expected, text) -> None:
    from conformance.errors import CaseError
    from conformance.harness.case import parse_case

    with pytest.raises(CaseError) as info:
        parse_case({**CASE, "schedule": schedule, "inputs": inputs, "expected": expected}, tmp_path / "x.toml")
    assert text in str(info.value) and str(info.value).startswith(str(tmp_path / "x.toml"))


def test_spot_steps_default_to_one_past_the_last() -> None:
    from conformance.harness.case import parse_case
    from conformance.harness.runner import run_case

    case = parse_case({**CASE, "schedule": {"name": "step", "step_size": 2}, "inputs": {"at": [0, 5]},
                       "expected": {"lr": [0.1, 0.001]}}, None)
    for name in ("torch", "jax", "oracle"):
        assert run_case(case, Backend(name)).passed
