"""Bad schedule settings: one-line errors that name the field, the same class on every backend."""

from __future__ import annotations

import pytest

from conformance.config import load_config
from conformance.errors import ConfigError, InputError
from conformance.harness.backends import Backend
from conformance.rules.schedules import check_run_length

# (schedule table, text the one-line ConfigError must contain)
SPEC_ERRORS = [
    ({"name": "cosine", "t_max": 0}, "schedule.t_max must be >= 1; received 0"),
    ({"name": "cosine"}, "schedule.t_max is required for name = 'cosine'"),
    ({"name": "warmup_cosine", "warmup_steps": 100, "total_steps": 100}, "schedule.warmup_steps must be less than total_steps = 100"),
    ({"name": "wsd", "warmup_steps": 30, "total_steps": 20, "decay_steps": 5}, "schedule.warmup_steps must be less than total_steps = 20"),
    ({"name": "wsd", "warmup_steps": 5, "total_steps": 20, "decay_steps": 16}, "schedule.decay_steps plus warmup_steps (5) must be <= total_steps = 20"),
    ({"name": "multistep", "milestones": [30, 20]}, "schedule.milestones[1] must be greater than milestones[0] = 30"),
    ({"name": "multistep", "milestones": [5, 5]}, "schedule.milestones[1] must be greater than milestones[0] = 5"),
    ({"name": "multistep", "milestones": []}, "schedule.milestones must list at least one update count"),
    ({"name": "multistep", "milestones": [0, 3]}, "schedule.milestones[0] must be >= 1"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 0.0}, "schedule.pct_start must be in (0, 1); received 0.0"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 1.0}, "schedule.pct_start must be in (0, 1); received 1.0"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 1.5}, "schedule.pct_start must be in (0, 1)"),
    ({"name": "onecycle", "total_steps": 3}, "schedule.pct_start times total_steps must be > 1"),
    ({"name": "onecycle", "total_steps": 100, "pct_start": 0.6, "three_phase": True}, "schedule.pct_start is too large for three_phase"),
    ({"name": "onecycle", "total_steps": 100, "max_momentum": 1.0}, "schedule.max_momentum must be in [0, 1)"),
    ({"name": "onecycle"}, "schedule.total_steps is required for name = 'onecycle'"),
    ({"name": "step", "step_size": 0}, "schedule.step_size must be >= 1"),
    ({"name": "step", "step_size": 2, "gamma": 0.0}, "schedule.gamma must be > 0"),
    ({"name": "step", "step_size": 2.5}, "schedule.step_size must be a valid integer"),
    ({"name": "exponential"}, "schedule.gamma is required for name = 'exponential'"),
    ({"name": "cosine", "t_max": 10, "eta_min": -1e-3}, "schedule.eta_min must be >= 0"),
    ({"name": "step", "step_size": 2, "t_max": 10}, "schedule.t_max is only used when name is cosine"),
    ({"name": "cosine", "t_max": 10, "warmup": 5}, "schedule.warmup is not a known key"),
    ({"name": "cosin", "t_max": 10}, "(did you mean 'cosine'?)"),
    ({"name": "linear", "start_factor": 0.0}, "schedule.start_factor must be in (0, 1] for linear"),
    ({"name": "linear", "end_factor": 1.5}, "schedule.end_factor must be in [0, 1]"),
    ({"name": "constant", "total_iters": 3}, "schedule.total_iters needs factor"),
    ({"name": "constant", "factor": 0.0}, "schedule.factor must be in (0, 1]"),
    ({"name": "inverse_sqrt", "warmup_steps": 0}, "schedule.timescale is required when warmup_steps = 0"),
    ({"name": "cosine_restarts", "t_0": 5, "t_mult": 0}, "schedule.t_mult must be >= 1"),
    ({"name": "sequential", "milestones": [5, 10], "schedulers": [{"name": "constant"}, {"name": "constant"}]},
     "schedule.milestones must have one entry fewer than schedulers"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "constant"}, {"name": "onecycle", "total_steps": 9}]},
     "schedule.schedulers[1].name cannot be 'onecycle' inside sequential"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "constant"}, {"name": "sequential", "schedulers": [{"name": "constant"}]}]},
     "schedule.schedulers[1].name cannot be 'sequential' inside sequential"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "constant", "unit": "epoch"}, {"name": "constant"}]},
     "schedule.schedulers[0].unit must equal the sequential schedule's unit 'update'"),
    ({"name": "sequential", "milestones": [5], "schedulers": [{"name": "cosine", "t_max": 0}, {"name": "constant"}]},
     "schedule.schedulers[0].t_max must be >= 1"),
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
    ({"name": "sgd"}, {"name": "onecycle", "total_steps": 10}, 11, ConfigError, "schedule.total_steps = 10 is shorter than the run"),
    ({"name": "adagrad"}, {"name": "onecycle", "total_steps": 10}, 5, ConfigError, "schedule.cycle_momentum = true needs an optimizer"),
    ({"name": "muon"}, {"name": "onecycle", "total_steps": 10}, 5, ConfigError, "schedule.cycle_momentum = true is not supported"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"params": ["a"], "lr": 0.01}]}, {"name": "onecycle", "total_steps": 10, "max_lr": 0.5},
     5, ConfigError, "schedule.max_lr sets one peak for every group"),
    ({"name": "sgd", "lr": 0.1, "groups": [{"params": ["a"], "lr": 0.0}]}, {"name": "wsd", "total_steps": 10, "decay_steps": 5, "eta_min": 1e-3},
     5, ConfigError, "schedule eta_min = 0.001 exceeds the lowest group lr 0.0"),
    ({"name": "sgd"}, {"name": "constant"}, 0, InputError, "steps must be an integer >= 1; received 0"),
]


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
