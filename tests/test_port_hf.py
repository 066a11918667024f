"""from_hf: Hugging Face TrainingArguments as the neutral spec, checked against the real objects:
transformers' Trainer builds its optimizer (HF's decay / no-decay grouping) and lr scheduler from the
same arguments on a tiny model with a LayerNorm, the native objects run a gradient stream (with the
Trainer's clip_grad_norm_), and twinstep's torch and JAX backends must follow them at every update
(float64: 1e-12 abs, 1e-10 rel). No download: the model is a torch module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.port import SCHEDULERS, float64_default, hf_schedule, initial, on_backends, parameters

from conformance.config import load_config
from conformance.errors import ConfigError, TwinstepWarning, UnsupportedError
from conformance.port import from_torch
from conformance.port.read.from_hf import from_hf
from conformance.port.verify.native import run_native_torch
from conformance.port.verify.traces import compare, gradient_stream

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
UPDATES = 14

ARGS = {
    "adamw-cosine-decay-groups": dict(learning_rate=0.01, weight_decay=0.1, warmup_steps=3, lr_scheduler_type="cosine",
                                      adam_beta1=0.85, adam_beta2=0.99, adam_epsilon=1e-6, max_grad_norm=0.5),
    "adamw-linear-warmup-ratio": dict(learning_rate=0.02, weight_decay=0.05, warmup_steps=0.25, max_grad_norm=0.0),
    "sgd-constant": dict(optim="sgd", learning_rate=0.1, lr_scheduler_type="constant", max_grad_norm=1.0),
    "adamw-constant-warmup": dict(learning_rate=0.01, weight_decay=0.1, lr_scheduler_type="constant_with_warmup",
                                  warmup_steps=3),
    "adamw-polynomial": dict(learning_rate=0.01, weight_decay=0.1, lr_scheduler_type="polynomial", warmup_steps=2,
                             lr_scheduler_kwargs={"lr_end": 1e-3, "power": 2.0}),
    "rmsprop-inverse-sqrt": dict(optim="rmsprop", learning_rate=0.001, weight_decay=0.01, warmup_steps=4,
                                 lr_scheduler_type="inverse_sqrt"),
    "adagrad-min-lr": dict(optim="adagrad", learning_rate=0.05, lr_scheduler_type="cosine_with_min_lr",
                           lr_scheduler_kwargs={"min_lr": 0.005}, warmup_steps=2),
    "adamw-hard-restarts": dict(learning_rate=0.01, weight_decay=0.1, lr_scheduler_type="cosine_with_restarts",
                                warmup_steps=2, lr_scheduler_kwargs={"num_cycles": 3}),  # 3 cycles of 4 updates
    "adamw-wsd": dict(learning_rate=0.01, weight_decay=0.1, lr_scheduler_type="warmup_stable_decay", warmup_steps=2,
                      lr_scheduler_kwargs={"num_decay_steps": 4, "decay_type": "linear"}),
}


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.GELU(), torch.nn.Linear(3, 2))


def _trainer(tmp_path: Path, kwargs: dict, model: torch.nn.Module, steps: int = UPDATES) -> object:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "hf"), report_to=[], use_cpu=True, max_steps=steps, **kwargs)
    trainer = Trainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    return trainer


@pytest.mark.parametrize("name", sorted(ARGS))
def test_training_arguments_follow_the_trainer_s_own_objects(name: str, tmp_path: Path) -> None:
    with float64_default():
        model = _model()
        trainer = _trainer(tmp_path, ARGS[name], model)
        spec = from_hf(trainer.args, model=model)
        named = dict(model.named_parameters())
        values = {k: p.detach().numpy().copy() for k, p in named.items()}
        windows = gradient_stream({k: v.shape for k, v in values.items()}, UPDATES, seed=5)
        clip = spec.get("clip")
        want = run_native_torch(trainer.optimizer, trainer.lr_scheduler, named, windows, clip=clip)
    config = load_config({**spec, "precision": {"dtype": "float64"}})
    for backend, trace in on_backends(config, values, windows).items():
        assert compare(trace, want)[1] is None, f"{backend}: {compare(trace, want)[1]} (spec {spec})"


def test_the_json_file_and_the_no_decay_rule(tmp_path: Path) -> None:
    with float64_default():
        model = _model()
        trainer = _trainer(tmp_path, dict(ARGS["adamw-cosine-decay-groups"], gradient_accumulation_steps=4, bf16=True,
                                          seed=7), model)
    path = tmp_path / "training_args.json"
    path.write_text(trainer.args.to_json_string())
    spec = from_hf(path, model=model)
    decayed = set(trainer.get_decay_parameter_names(model))  # HF's own rule
    kept = {n for n, _ in model.named_parameters()} - decayed
    assert kept == {"0.bias", "1.weight", "1.bias", "3.bias"}
    import fnmatch

    assert {n for n, _ in model.named_parameters() if any(fnmatch.fnmatchcase(n, g)
                                                          for g in spec["optimizer"]["no_weight_decay"])} == kept
    assert spec["accumulation"] == {"steps": 4, "normalize": "tokens"} and spec["precision"] == {"dtype": "bfloat16"}
    assert spec["run"] == {"seed": 7, "max_updates": UPDATES}
    assert from_hf(json.loads(path.read_text()), model=model, num_items_in_batch=False)["accumulation"]["normalize"] \
        == "micro_batches"


@pytest.mark.parametrize("args, error, words", [
    ({"learning_rate": 0.1, "optim": "adafactor", "max_steps": 5}, UnsupportedError, "optim = 'adafactor': twinstep reads"),
    ({"learning_rate": 0.1, "max_steps": 5, "lr_scheduler_type": "reduce_lr_on_plateau"}, UnsupportedError,
     "lr_scheduler_type = 'reduce_lr_on_plateau' cannot be translated"),
    ({"learning_rate": 0.1, "max_steps": 5, "lr_scheduler_type": "cosine_with_restarts",
      "lr_scheduler_kwargs": {"num_cycles": 2}}, UnsupportedError, r"its period .* = 2.5 is not a whole number"),
    ({"learning_rate": 0.1, "max_steps": -1}, ConfigError, "max_steps = -1: .*pass num_training_steps"),
    ({"learning_rate": 0.1, "max_steps": 5, "weight_decay": 0.1}, ConfigError, "weight_decay > 0: .*pass model="),
    ({"learning_rate": 0.1, "max_steps": 5, "optim_args": "momentum=0.9"}, UnsupportedError, "optim_args"),
    ({"max_steps": 5}, ConfigError, "no learning_rate"),
])
def test_what_has_no_reading_is_refused_in_one_line(args: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words) as info:
        from_hf(args)
    assert "\n" not in str(info.value)


def test_negative_control_a_spec_without_hf_s_no_decay_groups_is_caught(tmp_path: Path) -> None:
    with float64_default():
        model = _model()
        trainer = _trainer(tmp_path, ARGS["adamw-cosine-decay-groups"], model)
        spec = from_hf(trainer.args, model=model)
        named = dict(model.named_parameters())
        values = {k: p.detach().numpy().copy() for k, p in named.items()}
        windows = gradient_stream({k: v.shape for k, v in values.items()}, UPDATES, seed=5)
        want = run_native_torch(trainer.optimizer, trainer.lr_scheduler, named, windows, clip=spec["clip"])
    del spec["optimizer"]["no_weight_decay"]  # every parameter decayed
    config = load_config({**spec, "precision": {"dtype": "float64"}})
    assert all(compare(t, want)[1] is not None for t in on_backends(config, values, windows).values())


def test_the_cli_ports_a_training_arguments_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import tomllib

    from conformance.cli import main

    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"learning_rate": 0.01, "weight_decay": 0.1, "warmup_steps": 0.1, "max_steps": -1,
                                "lr_scheduler_type": "cosine", "max_grad_norm": 1.0, "gradient_accumulation_steps": 4}))
    assert main(["port", str(path), "--to", "spec", "--training-steps", "1000", "--no-decay", "*.bias",
                 "--token-normalized", "no"]) == 0
    spec = tomllib.loads(capsys.readouterr().out)
    assert spec["schedule"]["warmup_steps"] == 100 and spec["optimizer"]["no_weight_decay"] == ["*.bias"]
    assert spec["accumulation"] == {"steps": 4, "normalize": "micro_batches"}
    assert main(["port", str(path), "--to", "spec"]) == 2  # epochs without their updates: one line
    assert "pass num_training_steps (twinstep port --training-steps N)" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# spec -> TrainingArguments (twinstep port CONFIG --to hf)
# ---------------------------------------------------------------------------------------------

SPECS = {
    "adamw-cosine": {"optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.1, "betas": [0.85, 0.99],
                                   "no_weight_decay": ["*.bias", "1.*"]},
                     "schedule": {"name": "warmup_cosine", "warmup_steps": 3, "total_steps": UPDATES,
                                  "start_factor": 0.0, "convention": "torch", "eta_min": 0.001},
                     "clip": {"max_norm": 0.5}},
    "sgd-linear": {"optimizer": {"name": "sgd", "lr": 0.1},
                   "schedule": {"name": "wsd", "warmup_steps": 2, "start_factor": 0.0, "total_steps": UPDATES,
                                "decay_steps": UPDATES - 2, "decay_type": "linear", "eta_min": 0.0}},
    "rmsprop-wsd": {"optimizer": {"name": "rmsprop", "lr": 0.01},
                    "schedule": {"name": "wsd", "warmup_steps": 2, "start_factor": 0.1, "total_steps": 12,
                                 "decay_steps": 4, "decay_type": "1-sqrt", "eta_min": 0.001}},
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_spec_written_as_training_arguments_trains_the_same_in_hf_s_trainer(name: str, tmp_path: Path) -> None:
    from conformance.port.write.hf_args import hf_arguments

    config = load_config({**SPECS[name], "run": {"max_updates": UPDATES}, "precision": {"dtype": "float64"}})
    kwargs, notes = hf_arguments(config)
    assert ("no_weight_decay" in str(notes)) is ("no_weight_decay" in SPECS[name]["optimizer"])
    with float64_default():
        model = _model()
        steps = kwargs.pop("max_steps")
        trainer = _trainer(tmp_path, kwargs, model, steps)
        named = dict(model.named_parameters())
        values = {k: p.detach().numpy().copy() for k, p in named.items()}
        windows = gradient_stream({k: v.shape for k, v in values.items()}, UPDATES, seed=6)
        want = run_native_torch(trainer.optimizer, trainer.lr_scheduler, named, windows, clip=SPECS[name].get("clip"))
    for backend, trace in on_backends(config, values, windows).items():
        assert compare(trace, want)[1] is None, f"{backend}: {compare(trace, want)[1]} ({kwargs})"
    back = from_hf({**kwargs, "max_steps": steps}, model=model)  # and back: the same schedule
    assert load_config({**back, "precision": {"dtype": "float64"}}).schedule == config.schedule


@pytest.mark.parametrize("spec, words", [
    ({"optimizer": {"name": "lion"}}, "optimizer.name = 'lion' has no TrainingArguments form"),
    ({"optimizer": {"name": "sgd", "momentum": 0.9}}, "optimizer.momentum = 0.9 has no TrainingArguments form"),
    ({"schedule": {"name": "step", "step_size": 3, "gamma": 0.5}}, "schedule.name = 'step' has no"),
    ({"clip": {"clip_value": 0.5}}, "clip = .* has no TrainingArguments form: Trainer clips by the global 2-norm"),
])
def test_what_trainer_cannot_state_is_refused(spec: dict, words: str) -> None:
    from conformance.port.write.hf_args import hf_arguments

    with pytest.raises(UnsupportedError, match=words):
        hf_arguments(load_config({**spec, "run": {"max_updates": 10}}))


def test_hard_restarts_say_the_schedule_is_exact_up_to_num_training_steps() -> None:
    named = parameters(initial())
    opt = torch.optim.SGD(named.values(), lr=0.1, momentum=0.9)
    scheduler = SCHEDULERS["hf-cosine-hard-restarts"](opt)
    with pytest.warns(TwinstepWarning, match="exact for the first num_training_steps = 12 updates; after them"):
        spec = from_torch(opt, scheduler, named)  # from_hf's run ends there: no warning (the Trainer test above)
    part = spec["schedule"]["schedulers"][1]
    assert part == {"name": "cosine_restarts", "t_0": 3, "t_mult": 1, "eta_min": 0.0}
    # what the warning says is so: at update 12 transformers' factor is 0, the cosine's 1 (a restart)
    assert scheduler.lr_lambdas[0](12) == 0.0 and scheduler.lr_lambdas[0](11) > 0.0


@pytest.mark.parametrize("warmup, total, cycles, words", [
    (2, 10, 3, r"hard_restarts_schedule_with_warmup_lr_lambda\): its period .* = 2.6666666666666665 is not a whole"),
    # 25 · (7 / 25) = 6.999999999999999 in floats: transformers' update 7 ends a cycle instead of restarting
    (0, 25, 25, "progress does not restart the cosine at update 7"),
])
def test_hard_restarts_no_spec_schedule_states_are_refused(warmup: int, total: int, cycles: int, words: str) -> None:
    named = parameters(initial())
    opt = torch.optim.SGD(named.values(), lr=0.1)
    scheduler = hf_schedule("get_cosine_with_hard_restarts_schedule_with_warmup", opt, warmup, total, num_cycles=cycles)
    with pytest.raises(UnsupportedError, match=words) as info:
        from_torch(opt, scheduler, named)
    assert "\n" not in str(info.value)
