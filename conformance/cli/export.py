"""`twinstep export`: a run's weights for other code (conformance.export; docs/export.md).

    twinstep export RUN_DIR --to hf -o DIR          # transformers.GPT2LMHeadModel.from_pretrained(DIR)
    twinstep export RUN_DIR --to torch -o DIR       # model.load_state_dict(load_file(DIR/model.safetensors))
    twinstep export RUN_DIR --to flax -o DIR        # ref_jax's NNX tree, '/'-joined paths
    twinstep export --checkpoint RUN_DIR/checkpoints/step-00000300 --to hf -o DIR --ema

RUN_DIR exports its newest checkpoint that verifies (the one --resume would take); --checkpoint
names one. Refusals (a non-empty -o DIR without --force, --ema on a run without an EMA, --to hf
for a model that is not the bundled gpt, a checkpoint that does not verify) are one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="write a run's weights as a Hugging Face GPT-2, a torch state_dict or a "
                                      "Flax parameter tree",
                       description="Export the weights of RUN_DIR's newest verified checkpoint (or --checkpoint "
                                   "PATH) to the directory -o DIR, written atomically.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a training run's output directory")
    p.add_argument("--to", required=True, choices=("hf", "torch", "flax"),
                   help="hf: GPT2LMHeadModel directory (gpt only); torch: ref_torch's state_dict names; "
                        "flax: ref_jax's NNX parameter tree")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output directory (new or empty)")
    p.add_argument("--checkpoint", metavar="PATH", help="one step-* checkpoint directory instead of RUN_DIR's newest")
    p.add_argument("--ema", action="store_true", help="export the weights' EMA ([ema]) instead of the model's")
    p.add_argument("--force", action="store_true", help="replace a non-empty -o DIR")
    p.add_argument("--tokenizer", metavar="bytes|PATH",
                   help="token-shard runs: the tokenizer the shards were made with ('bytes' or a tokenizer.json)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from conformance.export import export

    r = export(args.run_dir, args.to, args.out, checkpoint=args.checkpoint, ema=args.ema, force=args.force,
               tokenizer=args.tokenizer)
    vocab = f", vocabulary: {r.vocabulary}" if r.vocabulary else ""
    print(f"twinstep: exported the {r.weights} weights of {r.checkpoint} (update {r.update}) as {args.to} to "
          f"{r.out}: {', '.join(r.files)}{vocab}", file=sys.stderr)
    return 0
