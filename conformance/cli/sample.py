"""`twinstep sample`: text from a trained gpt (conformance.generate).

    twinstep sample RUN_DIR --prompt "ROMEO:" --tokens 200 [--temperature 0.8] [--top-k 40] [--seed 1]
                    [--backend torch|jax] [--checkpoint PATH] [--ema] [--dtype float64] [--tokenizer bytes|PATH]

RUN_DIR's newest checkpoint that verifies (as `twinstep export` picks it), or --checkpoint PATH;
--ema samples from the EMA weights. The vocabulary is the run's: its corpus's characters, or for
token shards the tokenizer beside them or --tokenizer. --dtype defaults to the run's parameter
dtype; a float64 run samples the same text on torch and JAX with the same seed. The prompt and
its continuation go to stdout, where they came from to stderr; refusals are one line, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sample", help="generate text from a trained gpt",
                       description="Continue --prompt with --tokens tokens from RUN_DIR's newest verified checkpoint.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a training run's output directory")
    p.add_argument("--prompt", default="\n", help="the text to continue (default: a newline, as nanoGPT's sample.py)")
    p.add_argument("--tokens", type=int, default=200, metavar="N", help="tokens to generate (default 200)")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy (the argmax); default 1.0")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sample among the K likeliest tokens")
    p.add_argument("--seed", type=int, default=0, help="the draws' seed (default 0)")
    p.add_argument("--backend", choices=("torch", "jax"), default="torch")
    p.add_argument("--checkpoint", metavar="PATH", help="one step-* checkpoint directory instead of RUN_DIR's newest")
    p.add_argument("--ema", action="store_true", help="sample from the weights' EMA ([ema]) instead of the model's")
    p.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default=None,
                   help="the forward pass's dtype (default: the run's precision.param_dtype)")
    p.add_argument("--tokenizer", metavar="bytes|PATH", help="token-shard runs: the tokenizer the shards were made with")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from conformance.errors import TwinstepWarning, UnsupportedError
    from conformance.export.source import read_source
    from conformance.export.vocab import run_vocabulary
    from conformance.generate import Codec, check_options, generate

    check_options(args.tokens, args.temperature, args.top_k)
    source = read_source(args.run_dir, args.checkpoint, args.ema)
    spec = source.spec
    if spec.name != "gpt":
        raise UnsupportedError(f"{source.path}: sample needs the built-in gpt; this run trained model.name = "
                               f"{spec.name!r}")
    with warnings.catch_warnings(record=True) as caught:  # export warns and goes on; sample cannot
        warnings.simplefilter("always", TwinstepWarning)
        vocab = run_vocabulary(source.config, source.meta, args.tokenizer, spec.vocab_size)
    if vocab is None:
        why = "; ".join(str(w.message).removeprefix("the vocabulary is not recorded: ") for w in caught
                        if issubclass(w.category, TwinstepWarning))
        why = why or "no tokenizer beside its token shards; name it with --tokenizer bytes|PATH"
        raise UnsupportedError(f"{source.path}: the run's vocabulary is unknown: {why}")
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=1)
    codec = Codec(vocab)
    prompt = codec.encode(args.prompt)
    dtype = args.dtype or source.config.precision.param_dtype
    backend, models = (importlib.import_module(f"ref_{args.backend}.{m}") for m in ("backend", "models"))
    with backend.context() if dtype == "float64" else contextlib.nullcontext():
        logits = models.last_logits(spec, source.weights, dtype)
        ids = generate(logits, prompt, args.tokens, block_size=spec.block_size, temperature=args.temperature,
                       top_k=args.top_k, seed=args.seed)
    print(f"twinstep: sampling {args.tokens} tokens from the {source.which} weights of {source.path} (update "
          f"{source.update}) on {args.backend} in {dtype}", file=sys.stderr)
    sys.stdout.write(args.prompt + codec.decode(ids) + "\n")
    return 0
