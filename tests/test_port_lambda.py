"""from_torch on LambdaLR / MultiplicativeLR with arbitrary lambdas: sampled into `tabulated`.

Expected values: the native torch objects' own trajectories (parameters and every group's lr per
update, float64, 1e-12 abs / 1e-10 rel), as in tests/test_port_torch.py."""

from __future__ import annotations

import math
import warnings

import pytest
from support.port import config_of, float64_default, native_run, on_backends, optimizer, parameters, initial
from torch.optim import lr_scheduler as sched

from conformance.errors import ConfigError, TwinstepWarning, UnsupportedError
from conformance.port import from_torch
from conformance.port.verify.traces import compare


def nanogpt(t: int) -> float:
    """nanoGPT's get_lr over its learning_rate: warm-up 3 updates, cosine to a tenth at update 9."""
    if t < 3:
        return (t + 1) / 4
    if t > 9:
        return 0.1
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * (t - 3) / 6))


MAKERS = {
    "lambda-nanogpt": lambda o: sched.LambdaLR(o, nanogpt),
    "multiplicative": lambda o: sched.MultiplicativeLR(o, lambda t: 0.9 if t % 3 else 1.1),
    # the lambda part ends at its milestone: sampled over it exactly, no sample_updates needed
    "sequential-lambda-warmup": lambda o: sched.SequentialLR(
        o, [sched.LambdaLR(o, lambda t: (t + 1) / 4), sched.CosineAnnealingLR(o, 6, 1e-3)], [3]),
    "sequential-lambda-last": lambda o: sched.SequentialLR(
        o, [sched.LinearLR(o, 0.2, 1.0, 2), sched.LambdaLR(o, lambda t: 0.8 ** math.sqrt(t))], [2]),
}
SAMPLED = {"lambda-nanogpt": 12, "multiplicative": 12, "sequential-lambda-warmup": None, "sequential-lambda-last": 12}


def _trajectories(name: str, pre_steps: int = 0, updates: int = 12, **read) -> tuple[dict, dict]:
    with float64_default():
        spec, position, values, windows, want = native_run("adam", MAKERS[name], updates=updates - pre_steps,
                                                           pre_steps=pre_steps, **read)
    return spec, {k: compare(t, want)[1] for k, t in on_backends(config_of(spec), values, windows, position).items()}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_sampled_lambda_equals_its_native_trajectory(name: str) -> None:
    sample = SAMPLED[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec, messages = _trajectories(name, sample_updates=sample) if sample else _trajectories(name)
    assert messages == {"torch": None, "jax": None}
    said = [str(w.message) for w in caught if issubclass(w.category, TwinstepWarning)]
    what = {"multiplicative": "MultiplicativeLR", "sequential-lambda-last": "LambdaLR (the SequentialLR part from "
            "update 2) sampled into a tabulated schedule for updates 2..11"}.get(name, "LambdaLR")
    if "sampled" not in what:
        what += " sampled into a tabulated schedule for updates 0..11"
    assert said == ([] if sample is None else [f"{what} (sample_updates = 12): exact there; from update 12 on it holds "
                                              f"the last factor {_last(spec)!r}, where the lr_lambda may go on changing"])


def _last(spec: dict) -> float:
    table = spec["schedule"]
    return (table["schedulers"][-1] if table["name"] == "sequential" else table)["factors"][-1]


def test_a_stepped_lambda_continues_from_its_position() -> None:
    with pytest.warns(TwinstepWarning, match="sample_updates = 12"):
        spec, messages = _trajectories("lambda-nanogpt", pre_steps=4, sample_updates=12)
    assert messages == {"torch": None, "jax": None} and spec["schedule"]["factors"][4] == nanogpt(4)


def test_negative_control_a_table_shorter_than_the_run_misses_the_rest() -> None:
    # sampled for 6 updates, run for 12: the table holds nanogpt(5) where the cosine goes on falling
    with pytest.warns(TwinstepWarning, match="sample_updates = 6"):
        _, messages = _trajectories("lambda-nanogpt", sample_updates=6)
    assert messages["torch"] is not None and messages["jax"] is not None


def _opt():
    named = parameters(initial())
    return named, optimizer("adam", named)


REFUSED = [
    (lambda o: sched.LambdaLR(o, nanogpt), {}, UnsupportedError,
     "LambdaLR cannot be translated: its lr_lambda is an arbitrary Python function whose mathematics twinstep "
     "cannot read; pass sample_updates=N"),
    (lambda o: sched.LambdaLR(o, [nanogpt, lambda t: nanogpt(t) if t < 5 else 0.2]), {"sample_updates": 9},
     UnsupportedError, "LambdaLR param group 1's lr_lambda gives the factor 0.2 at update 5, group 0's "),
    (lambda o: sched.LambdaLR(o, lambda t: 1.0 / (4 - t)), {"sample_updates": 9}, UnsupportedError,
     "LambdaLR's lr_lambda raised ZeroDivisionError at update 4: float division by zero"),
    (lambda o: sched.LambdaLR(o, lambda t: 1.0 - t / 4), {"sample_updates": 9}, UnsupportedError,
     r"schedule.factors\[5\] must be >= 0; received -0.25"),
    (lambda o: sched.SequentialLR(o, [sched.StepLR(o, 2), sched.LambdaLR(o, nanogpt)], [6]), {"sample_updates": 6},
     UnsupportedError, "sample_updates = 6 ends before SequentialLR part 1 starts at update 6"),
    (lambda o: sched.LambdaLR(o, nanogpt), {"sample_updates": 0}, ConfigError,
     "sample_updates must be a whole number of updates >= 1; received 0"),
    (lambda o: sched.LambdaLR(o, nanogpt), {"sample_updates": 2.5}, ConfigError, "received 2.5"),
]


@pytest.mark.parametrize("make, read, error, words", REFUSED, ids=[w.split(":")[0][:40] for *_, w in REFUSED])
def test_what_cannot_be_sampled_is_refused_in_one_line(make, read: dict, error: type, words: str) -> None:
    named, opt = _opt()
    with pytest.raises(error, match=words) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", TwinstepWarning)
        from_torch(opt, make(opt), named, **read)
    assert "\n" not in str(info.value)


def test_a_table_that_ends_before_the_position_is_refused() -> None:
    named, opt = _opt()
    scheduler = sched.LambdaLR(opt, nanogpt)
    for _ in range(5):
        opt.step()
        scheduler.step()
    with pytest.raises(UnsupportedError, match="sample_updates = 5 does not reach the scheduler's position, update 5"), \
            pytest.warns(TwinstepWarning):
        from_torch(opt, scheduler, named, sample_updates=5)
