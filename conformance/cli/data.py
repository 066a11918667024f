"""`twinstep data`: prepare data for `twinstep train`.

    twinstep data tokenize TEXT_FILES... -o DIR [--tokenizer bytes|PATH/tokenizer.json] [--val-fraction F]

writes llm.c token shards (conformance.data.tokenize) that `[data] name = "tokens"` trains on.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("data", help="prepare data: tokenize text into token shards",
                       description="Prepare data for `twinstep train`.")
    inner = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    t = inner.add_parser("tokenize", help="text files -> llm.c token shards ([data] name = 'tokens')",
                         description="Tokenize TEXT_FILES into DIR/train_*.bin and DIR/val_*.bin, llm.c token "
                                     "shards (a header of 256 int32: 20240520, 1, count; then uint16 tokens).")
    t.add_argument("files", nargs="+", metavar="TEXT_FILE", help="UTF-8 text files, in order")
    t.add_argument("-o", "--out", required=True, metavar="DIR", help="output directory (must hold no shards yet)")
    t.add_argument("--tokenizer", default="bytes", metavar="bytes|PATH",
                   help="'bytes' (UTF-8 bytes, vocabulary 256; default) or a Hugging Face tokenizer.json "
                        "(needs: pip install 'twinstep[tokenizers]')")
    t.add_argument("--val-fraction", type=float, default=0.0, metavar="F",
                   help="the last fraction F of each file's tokens goes to the validation shards (default 0)")
    t.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="N",
                   help="tokens per shard at most (default 100,000,000, as llm.c)")
    t.add_argument("--progress", choices=("auto", "bar", "none"), default="auto",
                   help="progress bar on stderr (auto: on a terminal)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from conformance.data.tokenize import tokenize

    show = {"auto": None, "bar": True, "none": False}[args.progress]
    s = tokenize(args.files, args.out, args.tokenizer, args.val_fraction, args.shard_tokens, progress=show)
    print(f"twinstep: wrote {s.train_tokens} training tokens in {len(s.train_shards)} shard(s) and "
          f"{s.val_tokens} validation tokens in {len(s.val_shards)} to {args.out} (vocabulary {s.vocab_size}: "
          f"set model.vocab_size >= {s.vocab_size}) with the tokenizer in {s.tokenizer}", file=sys.stderr)
    return 0
