"""from_torch: torch.optim / lr_scheduler objects as the neutral spec, checked against the objects' own
trajectories: native objects run N updates of a fixed gradient stream, the
translated spec runs on twinstep's torch and JAX backends, and parameters and lrs must agree at
every update at the float64 tolerance (1e-12 abs, 1e-10 rel)."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.port import (
    NEEDS_MOMENTUM,
    OPTIMIZERS,
    SCHEDULERS,
    SHAPES,
    config_of,
    float64_default,
    hf_schedule,
    initial,
    native_run,
    on_backends,
    optimizer,
    parameters,
)
from support.processes import PROCESS_S, run_process
from torch.optim import lr_scheduler as sched

from conformance.errors import ConfigError, UnsupportedError
from conformance.port import from_torch
from conformance.port.read.patterns import cover, owner
from conformance.port.verify.native import run_native_torch
from conformance.port.verify.traces import compare, gradient_stream


def assert_same(spec: dict, position: int, values: dict, windows: list, want) -> None:
    got = on_backends(config_of(spec), values, windows, position)
    for name, trace in got.items():
        err, message = compare(trace, want)
        assert message is None, f"{name}: {message} (spec {spec})"


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_every_optimizer_class_with_groups_equals_its_native_trajectory(kind: str) -> None:
    with float64_default():
        spec, position, values, windows, want = native_run(kind, "step")
    assert spec["optimizer"]["groups"], "two torch param groups become a group entry and the default"
    assert_same(spec, position, values, windows, want)


@pytest.mark.filterwarnings("ignore:.*exact for the first num_training_steps")  # hard restarts: runs stop before
@pytest.mark.parametrize("kind, schedule", [("sgd-nesterov", s) for s in sorted(set(SCHEDULERS) - {"none"})]
                         + [("adam", "onecycle"), ("adam", "onecycle-3-linear"),  # OneCycle cycles beta1
                            ("adam", "cyclic-momentum"),
                            ("adam", "hf-constant-warmup"), ("adam", "hf-polynomial")])  # two group lrs
def test_every_scheduler_class_equals_its_native_trajectory(kind: str, schedule: str) -> None:
    with float64_default():
        spec, position, values, windows, want = native_run(kind, schedule, updates=12)
    assert_same(spec, position, values, windows, want)


@pytest.mark.parametrize("schedule", ["step", "onecycle", "warmup-cosine", "restarts", "chained", "cyclic-momentum",
                                      "hf-cosine-warmup", "hf-linear-warmup", "hf-constant-warmup", "hf-polynomial"])
def test_a_stepped_scheduler_continues_from_its_position(schedule: str) -> None:
    with float64_default():
        spec, position, values, windows, want = native_run("sgd-nesterov", schedule, updates=6, pre_steps=5)
    assert position == 5
    assert_same(spec, position, values, windows, want)


def test_translations_read_the_initial_lr_not_the_current_one() -> None:
    named = parameters(initial())
    opt = torch.optim.SGD(named.values(), lr=0.1)
    s = sched.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        opt.step()
        s.step()
    spec = from_torch(opt, s)
    assert opt.param_groups[0]["lr"] == 0.0125 and spec["optimizer"]["lr"] == 0.1 and spec.position == 3


def test_onecycle_factors_are_recovered_exactly() -> None:
    named = parameters(initial())
    opt = torch.optim.Adam(named.values())
    s = sched.OneCycleLR(opt, max_lr=0.07, total_steps=37, pct_start=0.23, div_factor=13.0, final_div_factor=7.0)
    table = from_torch(opt, s)["schedule"]
    assert (table["pct_start"], table["div_factor"], table["final_div_factor"]) == (0.23, 13.0, 7.0)
    assert table["cycle_momentum"] and table["max_momentum"] == 0.95


@pytest.mark.parametrize("floors, want", [([0.004, 0.05], [0.004, 0.05]), ([0.01, 0.01], 0.01)])
def test_plateau_floors_per_group_read_as_a_list(floors, want) -> None:
    """ReduceLROnPlateau's min_lr per group: a list in the spec, one number when they agree."""
    named = parameters(initial())
    opt = optimizer("sgd", named)
    table = from_torch(opt, sched.ReduceLROnPlateau(opt, patience=0, min_lr=floors), named)["schedule"]
    assert table["min_lr"] == want


def test_warmup_plus_cosine_reads_as_warmup_cosine() -> None:
    named = parameters(initial())
    opt = torch.optim.AdamW(named.values(), lr=1e-3)
    s = SCHEDULERS["warmup-cosine"](opt)
    assert from_torch(opt, s)["schedule"] == {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": 10,
                                              "start_factor": 0.1, "eta_min": 1e-4, "convention": "torch"}


# ------------------------------------------------------------------ random set-ups (hypothesis)

_CHOICES = {
    "sgd": lambda d: dict(momentum=d(st.sampled_from([0.0, 0.5, 0.9])), dampening=d(st.sampled_from([0.0, 0.2])),
                          weight_decay=d(st.sampled_from([0.0, 0.1]))),
    "adam": lambda d: dict(betas=(d(st.sampled_from([0.8, 0.9])), d(st.sampled_from([0.9, 0.999]))),
                           amsgrad=d(st.booleans()), weight_decay=d(st.sampled_from([0.0, 0.05])),
                           decoupled_weight_decay=d(st.booleans()), maximize=d(st.booleans())),
    "rmsprop": lambda d: dict(alpha=d(st.sampled_from([0.9, 0.99])), momentum=d(st.sampled_from([0.0, 0.7])),
                              centered=d(st.booleans()), eps=d(st.sampled_from([1e-8, 1e-3]))),
    "adagrad": lambda d: dict(lr_decay=d(st.sampled_from([0.0, 0.05])),
                              initial_accumulator_value=d(st.sampled_from([0.0, 0.3]))),
    "nadam": lambda d: dict(momentum_decay=d(st.sampled_from([4e-3, 0.05])), decoupled_weight_decay=d(st.booleans()),
                            weight_decay=d(st.sampled_from([0.0, 0.1]))),
    "radam": lambda d: dict(betas=(0.9, d(st.sampled_from([0.9, 0.999]))), weight_decay=d(st.sampled_from([0.0, 0.1]))),
}
_CLASSES = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop,
            "adagrad": torch.optim.Adagrad, "nadam": torch.optim.NAdam, "radam": torch.optim.RAdam}


@pytest.mark.filterwarnings("ignore:.*exact for the first num_training_steps")  # hard restarts: runs stop before
@settings(max_examples=max(12, settings.default.max_examples // 2))  # ci: 12, dev: 50, long: 500
@given(st.data())
def test_random_native_setups_equal_their_translation(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(_CLASSES)))
    options = _CHOICES[name](data.draw)
    lr = data.draw(st.sampled_from([0.01, 0.05]))
    schedule = data.draw(st.sampled_from(sorted(set(SCHEDULERS) - {"onecycle", *NEEDS_MOMENTUM})))
    group_lr = data.draw(st.sampled_from([None, 0.02]))
    values = initial(seed=data.draw(st.integers(0, 3)))
    with float64_default():
        named = parameters(values)
        first = {"params": [named["enc.bias"], named["head.bias"]], **({"lr": group_lr} if group_lr else {})}
        opt = _CLASSES[name]([first, {"params": [named["enc.weight"], named["head.weight"]]}], lr=lr, **options)
        scheduler = SCHEDULERS[schedule](opt) if schedule != "onecycle-3-linear" else None
        spec = from_torch(opt, scheduler, named)
        windows = gradient_stream({k: v.shape for k, v in values.items()}, 8, seed=7)
        want = run_native_torch(opt, scheduler, named, windows)
    assert_same(dict(spec), spec.position, values, windows, want)


# ------------------------------------------------------------------ what cannot be expressed


def _observed(plateau: sched.ReduceLROnPlateau) -> sched.ReduceLROnPlateau:
    plateau.step(1.0)
    return plateau


def _opt() -> tuple[dict, torch.optim.Optimizer]:
    named = parameters(initial())
    return named, torch.optim.SGD(named.values(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize("make, words", [
    (lambda o: sched.LambdaLR(o, lambda s: 0.9 ** s), "LambdaLR cannot be translated: its lr_lambda is an arbitrary"),
    (lambda o: sched.MultiplicativeLR(o, lambda s: 0.9), "MultiplicativeLR cannot be translated"),
    (lambda o: hf_schedule("get_wsd_schedule", o, 2, 3, num_stable_steps=1, warmup_type="cosine"),
     "warmup_type = 'cosine'; twinstep's warm-ups are linear"),
    (lambda o: hf_schedule("get_wsd_schedule", o, 2, 3, num_stable_steps=1, num_cycles=1.0),
     "num_cycles = 1.0 is not wsd's half cosine"),
    (lambda o: hf_schedule("get_cosine_schedule_with_warmup", o, 2, 9, num_cycles=0.75),
     r"its half period .* = 4.666666666666667 is not a whole number"),
    (lambda o: hf_schedule("get_linear_schedule_with_warmup", o, 5, 5), "num_training_steps = 5 <= num_warmup_steps"),

    (lambda o: _observed(sched.ReduceLROnPlateau(o)), "ReduceLROnPlateau has observed 1 metrics: its best value"),
    (lambda o: sched.CyclicLR(o, 0.01, 0.1, scale_fn=lambda x: 0.5), "CyclicLR with a custom scale_fn cannot be"),
    (lambda o: sched.ChainedScheduler([sched.StepLR(o, 2), sched.CyclicLR(o, 0.01, 0.1)]),
     "ChainedScheduler part 1 is a CyclicLR, which sets the lr rather than multiplying it"),
    (lambda o: sched.ChainedScheduler([sched.StepLR(o, 2), sched.CosineAnnealingLR(o, 9, eta_min=1e-3)]),
     r"ChainedScheduler part 1: CosineAnnealingLR\(eta_min = 0.001\) anneals lr − eta_min"),
    (lambda o: sched.SequentialLR(o, [sched.StepLR(o, 2), sched.CyclicLR(o, 0.01, 0.1)], [3]),
     "SequentialLR part 1 is a CyclicLR"),
    (lambda o: sched.MultiStepLR(o, [3, 3, 5]), "MultiStepLR milestone 3 is listed more than once"),
    (lambda o: sched.SequentialLR(o, [sched.StepLR(o, 2), sched.SequentialLR(o, [sched.StepLR(o, 2),
                                   sched.StepLR(o, 3)], [2])], [4]), "SequentialLR part 1 is a SequentialLR"),
])
def test_inexpressible_schedulers_are_refused_with_one_line(make, words: str) -> None:
    named, opt = _opt()
    with pytest.raises(UnsupportedError, match=words) as info:
        from_torch(opt, make(opt), named)
    assert "\n" not in str(info.value)


def test_transformers_min_lr_rate_needs_one_lr_and_a_misread_schedule_is_caught(monkeypatch) -> None:
    """min_lr_rate is a fraction of each group's lr, twinstep's eta_min one lr: groups with two lrs
    are refused, and so are groups whose lambdas are not all the same transformers function. Negative control: HF's cosine read with optax's convention (eta_min held after the
    period instead of climbing back) fails the trajectory check."""
    named = parameters(initial())
    opt = optimizer("adam", named)  # its second group has another lr
    with pytest.raises(UnsupportedError, match="min_lr_rate = 0.1 of groups with different lrs"):
        from_torch(opt, hf_schedule("get_cosine_with_min_lr_schedule_with_warmup", opt, 0, 8, min_lr_rate=0.1),
                   named)
    mixed = sched.LambdaLR(opt, [hf_schedule("get_cosine_schedule_with_warmup", opt, 2, 9).lr_lambdas[0],
                                 lambda s: 1.0])  # one group's lambda is transformers', the other's not
    with pytest.raises(UnsupportedError, match="LambdaLR cannot be translated: its lr_lambda is an arbitrary"):
        from_torch(opt, mixed, named)
    from conformance.port.read import torch_sched

    real = torch_sched.read_lambda
    monkeypatch.setattr(torch_sched, "read_lambda", lambda *a: {**real(*a), "convention": "optax"})
    with float64_default():
        spec, position, values, windows, want = native_run("sgd-nesterov", "hf-cosine-warmup", updates=12)
    assert spec["schedule"]["convention"] == "optax"
    got = on_backends(config_of(spec), values, windows, position)
    assert all(compare(trace, want)[1] is not None for trace in got.values())


def _amp_run(clip: dict | None, hold: bool = False) -> tuple[dict, list[str]]:
    """An AMP loop (GradScaler, StepLR, the loop's clipping) ported and run on both backends against
    the native loop over a stream with non-finite updates 2, 3 and 7: the first mismatch per backend."""
    with float64_default():
        values = initial()
        named = parameters(values)
        opt = optimizer("adam", named)
        sch = SCHEDULERS["step"](opt)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=3)
        spec = from_torch(opt, sch, named, scaler=scaler, clip=clip)
        windows = gradient_stream(SHAPES, 12, seed=1, poison=(2, 3, 7))
        want = run_native_torch(opt, sch, named, windows, scaler=scaler, clip=clip)
    precision = {**spec["precision"], "dtype": "float64", **({"schedule_on_skip": "hold"} if hold else {})}
    from conformance.config import load_config

    got = on_backends(load_config({**spec, "precision": precision}), values, windows, spec.position)
    assert want.skipped == [t in (2, 3, 7) for t in range(12)] and len(set(want.scales)) > 2
    return dict(spec), [m for trace in got.values() if (m := compare(trace, want)[1]) is not None]


@pytest.mark.parametrize("clip", [None, {"max_norm": 0.05}, {"clip_value": 0.01}], ids=["no-clip", "norm", "value"])
def test_an_amp_loop_ports_to_the_same_skips_scales_and_weights(clip: dict | None) -> None:
    spec, failures = _amp_run(clip)
    assert spec["precision"] == {"loss_scale": "dynamic", "init_scale": 256.0, "growth_factor": 2.0,
                                 "backoff_factor": 0.5, "growth_interval": 3, "schedule_on_skip": "advance"}
    assert spec.get("clip") == clip and failures == []


def test_negative_control_an_amp_loop_ported_with_the_schedule_held_on_skips_differs() -> None:
    _, failures = _amp_run(None, hold=True)  # torch's recipe steps the scheduler after a skipped step
    assert len(failures) == 2 and all("lr of" in f for f in failures)


def test_the_rest_of_a_loop_is_refused_or_read_in_one_line() -> None:
    named, opt = _opt()
    scaler = torch.amp.GradScaler("cpu")
    assert from_torch(opt, named_parameters=named, accumulation=4)["accumulation"] == {"steps": 4,
                                                                                       "normalize": "micro_batches"}
    assert from_torch(opt, named_parameters=named, scaler=torch.amp.GradScaler("cpu", enabled=False)
                      )["precision"] == {"loss_scale": "none"}
    loss = sum(p.sum() for p in named.values())
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    scaler._scale.fill_(1024.0)  # as after a skipped step: a scale of its own
    with pytest.raises(UnsupportedError, match=r"scaler: this GradScaler has stepped \(scale 1024.0"):
        from_torch(opt, named_parameters=named, scaler=scaler)
    for bad, words in [({"max_nrom": 1.0}, "clip must name the loop's clipping call's arguments"),
                       ({"norm_type": 1.0}, "norm_type and error_if_nonfinite belong to clip_grad_norm_")]:
        with pytest.raises(ConfigError, match=words):
            from_torch(opt, named_parameters=named, clip=bad)
    with pytest.raises(ConfigError, match="accumulation must be the loop's micro-batches per optimizer step"):
        from_torch(opt, named_parameters=named, accumulation=0)
    with pytest.raises(UnsupportedError, match="scaler: expected a torch.amp.GradScaler"):
        from_torch(opt, named_parameters=named, scaler=object())


def test_unknown_and_subclassed_optimizers_are_refused() -> None:
    named = parameters(initial())
    with pytest.raises(UnsupportedError, match="torch.optim.adadelta.Adadelta cannot be translated"):
        from_torch(torch.optim.Adadelta(named.values()))

    class MyAdam(torch.optim.Adam):
        def step(self, closure=None):  # noqa: ANN001, ANN201
            return super().step(closure)

    with pytest.raises(UnsupportedError, match="it overrides step of torch.optim.Adam, which may change its step"):
        from_torch(MyAdam(named.values()))

    class Scaled(torch.optim.Adam):
        def _init_group(self, *args):  # noqa: ANN001, ANN202
            return super()._init_group(*args)

    with pytest.raises(UnsupportedError, match="it overrides _init_group of torch.optim.Adam"):
        from_torch(Scaled(named.values()))


def test_a_subclass_that_changes_nothing_in_the_step_reads_as_its_base_class() -> None:
    class NamedAdamW(torch.optim.AdamW):
        """A project's own AdamW: other defaults and a repr, the same step."""

        def __init__(self, params, lr: float = 3e-3, **kw) -> None:  # noqa: ANN001
            super().__init__(params, lr=lr, betas=(0.85, 0.98), **kw)

        def __repr__(self) -> str:
            return "NamedAdamW"

        def describe(self) -> str:  # a helper of its own, which the step never calls
            return "mine"

    with float64_default():
        values = initial()
        named = parameters(values)
        opt = NamedAdamW(named.values(), weight_decay=0.05)
        spec = from_torch(opt, named_parameters=named)
        windows = gradient_stream(SHAPES, 6, seed=2)
        want = run_native_torch(opt, None, named, windows)
    assert spec["optimizer"]["name"] == "adamw" and spec["optimizer"]["betas"] == [0.85, 0.98]
    assert_same(dict(spec), 0, values, windows, want)


def test_options_twinstep_lacks_are_refused() -> None:
    named = parameters(initial())
    with pytest.raises(UnsupportedError, match=r"param_groups\[0\] has differentiable = True"):
        from_torch(torch.optim.SGD(named.values(), lr=0.1, differentiable=True))
    with pytest.raises(UnsupportedError, match="ConstantLR has no twinstep equivalent: schedule.factor"):
        opt = torch.optim.SGD(named.values(), lr=0.1)
        from_torch(opt, sched.ConstantLR(opt, factor=0.0))


def test_a_trainable_parameter_outside_the_optimizer_is_refused() -> None:
    named = parameters(initial())
    opt = torch.optim.SGD([named["enc.weight"]], lr=0.1)
    with pytest.raises(UnsupportedError, match="parameter 'enc.bias' requires grad but is in no param group"):
        from_torch(opt, None, named)
    for name in ("enc.bias", "head.weight", "head.bias"):
        named[name].requires_grad_(False)
    assert from_torch(opt, None, named)["optimizer"]["lr"] == 0.1  # frozen ones are fine


def test_several_groups_need_parameter_names() -> None:
    named = parameters(initial())
    opt = optimizer("adamw", named)
    with pytest.raises(ConfigError, match="has 2 param groups with different settings: pass named_parameters"):
        from_torch(opt)
    built_with_names = torch.optim.AdamW([{"params": [named["enc.bias"]], "param_names": ["enc.bias"], "lr": 0.1},
                                          {"params": [named["enc.weight"]], "param_names": ["enc.weight"]}])
    assert from_torch(built_with_names)["optimizer"]["groups"][0]["params"] == ["enc.bias"]


def test_groups_that_differ_only_in_their_parameters_need_no_names() -> None:
    """Two groups with the same settings (as a loop that groups parameters for another reason writes
    them) update every parameter as one group: read without names, and the one-group spec follows
    the native optimizer and scheduler update by update on every backend."""
    values = initial()
    with float64_default():
        named = parameters(values)
        bias = [p for n, p in named.items() if n.endswith("bias")]
        weights = [p for n, p in named.items() if not n.endswith("bias")]
        opt = torch.optim.AdamW([{"params": bias}, {"params": weights}], lr=0.01, weight_decay=0.1)
        scheduler = SCHEDULERS["warmup-cosine"](opt)
        spec = from_torch(opt, scheduler)
        assert "groups" not in spec["optimizer"] and spec["optimizer"]["weight_decay"] == 0.1
        windows = gradient_stream({k: v.shape for k, v in values.items()}, 10, seed=3)
        want = run_native_torch(opt, scheduler, named, windows)
    assert_same(dict(spec), spec.position, values, windows, want)


def test_an_lr_changed_behind_the_schedulers_back_is_refused() -> None:
    named, opt = _opt()
    s = sched.StepLR(opt, 2)
    opt.param_groups[0]["lr"] = 0.5  # a manual edit the translation would lose
    with pytest.raises(UnsupportedError, match=r"param_groups\[0\]\['lr'\] = 0.5, but the scheduler's own schedule"):
        from_torch(opt, s, named)


def test_torch_adagrad_fills_accumulators_from_the_constructor_and_the_spec_says_so() -> None:
    named = parameters(initial())
    opt = torch.optim.Adagrad([{"params": [named["enc.bias"]], "initial_accumulator_value": 5.0},
                               {"params": [named["enc.weight"]]}], initial_accumulator_value=0.5)
    spec = from_torch(opt, None, {k: named[k] for k in ("enc.bias", "enc.weight")})
    assert spec["optimizer"]["initial_accumulator_value"] == 0.5
    assert "initial_accumulator_value" not in spec["optimizer"]["groups"][0]  # torch ignores the group's 5.0


# ------------------------------------------------------------------ glob patterns


def test_cover_finds_short_patterns_that_select_exactly_the_group() -> None:
    names = ["enc.0.weight", "enc.0.bias", "enc.1.weight", "enc.1.bias", "head.weight", "head.bias"]
    biases = [n for n in names if n.endswith("bias")]
    assert cover(biases, names) == ["*.bias"]
    assert cover(["enc.0.weight", "enc.0.bias"], names) == ["enc.0.*"]
    assert cover(["head.weight"], names) == ["head.weight"]
    odd = ["w[0]", "w[1]"]
    assert cover(["w[0]"], odd) == ["w[[]0]"] and owner("w[0]", [cover(["w[0]"], odd)]) == 0


def test_conformance_port_imports_neither_torch_nor_jax() -> None:
    code = ("import sys, conformance.port, conformance.port.verify.traces, conformance.port.write.torch_code, "
            "conformance.port.write.optax_code, conformance.port.read.weights, conformance.cli.port; "
            "bad = [m for m in ('torch', 'jax', 'optax', 'flax') if m in sys.modules]; assert not bad, bad")
    run_process([sys.executable, "-c", code], "import conformance.port", PROCESS_S, check=True)
