"""`twinstep port`: translate between native set-ups and the neutral spec (docs/porting.md).

    twinstep port CONFIG --to torch [--check]     a runnable torch.optim + lr_scheduler + AMP snippet
    twinstep port CONFIG --to optax [--check]     an optax chain and a step function
    twinstep port OPTAX.toml --to spec            an optax description ([optax] table) as neutral TOML
    twinstep port training_args.json --to spec    Hugging Face TrainingArguments as neutral TOML
    twinstep port CONFIG --to hf                  TrainingArguments keyword arguments (JSON)
    twinstep port weights SRC --config CONFIG -o OUT.safetensors [--format auto|torch|hf|flax]

CONFIG may also be an optax description or a TrainingArguments JSON (`--training-steps N` when its
max_steps is -1, `--no-decay GLOB` for the parameters HF leaves undecayed when weight_decay > 0): it
is translated to the spec first. `--check` runs the
generated snippet and twinstep's backend on a small random problem in float64 and reports the
largest difference (stderr), failing if it exceeds 1e-12 + 1e-10·|value|.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from conformance import tomlio
from conformance.config import apply_overrides, dump_config, load_config, load_toml
from conformance.errors import ConfigError, TwinstepError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("port", help="translate a config to torch / optax code, an optax description to the "
                                    "spec, or foreign weights to the neutral format",
                       description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("args", nargs="+", metavar="CONFIG | weights SRC",
                   help="a config or optax description (TOML); or `weights` and a weight file")
    p.add_argument("--to", choices=["torch", "optax", "spec", "hf"], help="what to print (configs)")
    p.add_argument("--check", action="store_true", help="run the snippet against twinstep's backend (float64)")
    p.add_argument("--updates-per-epoch", type=int, metavar="N", help="for schedule.unit = 'epoch'")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--config", metavar="CONFIG", help="weights: the config whose [model] the weights are for")
    p.add_argument("--format", choices=["auto", "torch", "hf", "flax"], default="auto", help="weights: layout")
    p.add_argument("--dtype", help="weights: the dtype to write (default: the config's parameter dtype)")
    p.add_argument("-o", "--output", metavar="PATH", help="where to write (default for code: stdout)")
    p.add_argument("--training-steps", type=int, metavar="N",
                   help="TrainingArguments JSON with max_steps = -1: the run's updates (epochs × updates per epoch)")
    p.add_argument("--no-decay", action="append", metavar="GLOB",
                   help="TrainingArguments JSON with weight_decay > 0: a parameter HF leaves undecayed (repeatable)")
    p.add_argument("--token-normalized", choices=["yes", "no"], default="yes",
                   help="TrainingArguments JSON: HF divides by the window's tokens (num_items_in_batch; yes) or the "
                        "model averages each micro-batch (no)")
    p.set_defaults(run=run)


def _spec_data(path: str, overrides: list[str], hf: dict[str, Any] | None = None) -> tuple[dict[str, Any], str, bool]:
    """(the neutral config data, what it came from, whether it was translated: an optax description or
    Hugging Face TrainingArguments JSON)."""
    if path.endswith(".json"):
        from conformance.port.read.from_hf import from_hf

        return apply_overrides(from_hf(path, **(hf or {})), overrides), Path(path).name, True
    data = load_toml(path)
    translated = "optax" in data
    if translated:
        from conformance.port import from_optax

        data = dict(from_optax(path))
    return apply_overrides(data, overrides), Path(path).name, translated


def _updates_per_epoch(config: Any, given: int | None) -> int:
    if config.schedule.unit != "epoch":
        return 1
    if given:
        return given
    try:
        from conformance.data.pipeline import updates_per_epoch

        return updates_per_epoch(config)
    except TwinstepError:
        raise ConfigError("schedule.unit = 'epoch' needs the updates per epoch: pass --updates-per-epoch N") from None


def _code(args: argparse.Namespace) -> int:
    if len(args.args) != 1:
        raise ConfigError("port takes one CONFIG (or `weights SRC`); received " + " ".join(args.args))
    if args.to is None:
        raise ConfigError("port CONFIG needs --to torch, --to optax, --to spec or --to hf")
    hf = {"num_training_steps": args.training_steps, "no_decay": args.no_decay,
          "num_items_in_batch": args.token_normalized == "yes"}
    data, source, translated = _spec_data(args.args[0], args.set, hf)
    config = load_config(data)
    if args.to == "spec":  # the translated sections as written; a neutral config fully resolved
        text = tomlio.dumps(data) if translated else dump_config(config)
    elif args.to == "hf":  # TrainingArguments keyword arguments; what HF decides itself, as notes
        import json

        from conformance.port.write.hf_args import hf_arguments

        kwargs, notes = hf_arguments(config)
        for note in notes:
            print(f"twinstep: note: {note}", file=sys.stderr)
        text = json.dumps(kwargs, indent=1) + "\n"
    else:
        from conformance.port.write.optax_code import optax_code
        from conformance.port.write.torch_code import torch_code

        upe = _updates_per_epoch(config, args.updates_per_epoch)
        make = torch_code if args.to == "torch" else optax_code
        text = make(config, source, upe)
        if args.check:
            _check(config, args.to, make, source, upe)
    _write(text, args.output)
    return 0


def _check(config: Any, framework: str, make: Any, source: str, upe: int) -> None:
    from conformance.port.verify.traces import self_check

    err, message, n = self_check(config, framework, lambda cfg: make(cfg, source, upe), updates_per_epoch=upe)
    backend = "torch" if framework == "torch" else "jax"
    if message is not None:
        raise TwinstepError(f"--check: the {framework} snippet differs from twinstep's {backend} backend: {message}")
    print(f"twinstep: checked: the {framework} snippet equals twinstep's {backend} backend over {n} updates "
          f"(float64, one non-finite update injected): max |difference| = {err:.3g}", file=sys.stderr)


def _weights(args: argparse.Namespace) -> int:
    if len(args.args) != 2:
        raise ConfigError("usage: twinstep port weights SRC --config CONFIG -o OUT.safetensors")
    if not args.config or not args.output:
        raise ConfigError("port weights needs --config CONFIG (its [model]) and -o OUT.safetensors")
    from conformance.checkpoint.files import save_tensors
    from conformance.port.read.weights import import_weights

    config = load_config(args.config, args.set)
    dtype = args.dtype or config.precision.param_dtype
    tensors = import_weights(args.args[1], config.model, args.format, dtype)
    save_tensors(args.output, tensors)
    total = sum(int(v.size) for v in tensors.values())
    print(f"twinstep: wrote {len(tensors)} tensors ({total} values, {dtype}) for the {config.model.name} model "
          f"to {args.output}", file=sys.stderr)
    return 0


def _write(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text)
    else:
        sys.stdout.write(text)


def run(args: argparse.Namespace) -> int:
    if args.args[0] == "weights":
        return _weights(args)
    return _code(args)
