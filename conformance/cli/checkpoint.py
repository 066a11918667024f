"""`twinstep checkpoint verify|list RUN_DIR`: each checkpoint's status, without training.

    twinstep checkpoint verify runs/a          # one line per checkpoint: verified, or refused and why
    twinstep checkpoint list runs/a            # the same, with update, size, age and val_loss columns

RUN_DIR is a run's output directory, its checkpoints/ directory, or one step-* directory. Every
checkpoint gets the check a resume makes (conformance.run.resume.load_valid: the hashes, the
manifest's own hash and schema, every field of the state); nothing is restored or changed. The
newest checkpoint that verifies is the one `--resume` continues from; when it is not the newest,
the line says so, with the flag that allows it (`checkpoint.allow_fallback`). A checkpoint that
disappears while it is read was rotated away by the run's keep_last (retention moves a checkpoint
aside before deleting it): its line says so and it counts as removed, not refused. `verify` exits 1
when a checkpoint still present is refused, `list` always 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from conformance import checkpoint as ckpt
from conformance.errors import CheckpointError, PathError
from conformance.run.resume import load_valid


def add_parser(sub: Any) -> None:
    p = sub.add_parser("checkpoint", help="verify or list a run's checkpoints (nothing is trained or changed)",
                       description="Check every checkpoint of RUN_DIR as --resume would (hashes, manifest, every "
                                   "state field) and print its status: verified, or refused and why.")
    p.add_argument("action", choices=("verify", "list"), help="verify: status lines, exit 1 if any is refused; "
                                                               "list: with update, size, age and val_loss")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, its checkpoints/ or one step-* directory")
    p.set_defaults(run=run)


def _targets(path: Path) -> list[tuple[int, Path]]:
    if ckpt.STEP_RE.match(path.name):
        return [(int(ckpt.STEP_RE.match(path.name).group(1)), path)]
    directory = path / "checkpoints" if (path / "checkpoints").exists() or (path / "checkpoints").is_symlink() else path
    if not path.exists():
        raise PathError(f"{path}: no such directory")
    return ckpt.list_checkpoints(directory)


def _size(path: Path) -> int:
    try:
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


def run(args: argparse.Namespace) -> int:
    path = Path(args.run_dir)
    found = _targets(path)
    if not found:
        print(f"{path}: no checkpoints", file=sys.stderr)
        return 0
    refused = 0
    resumes_from: Path | None = None
    if args.action == "list":
        print(f"{'checkpoint':<13}  {'update':>8}  {'size':>14}  {'age':>10}  {'val_loss':>10}  status")
    for update, step in found:
        try:
            loaded = load_valid(step)
        except CheckpointError as exc:
            manifest = None
            if os.path.lexists(step):
                refused += 1
                status = f"refused: {exc}"
            else:  # moved aside by retention while it was read: a healthy run's rotation, not damage
                status = "removed while being read (the run's checkpoint.keep_last rotated it away)"
        else:
            manifest = loaded.manifest
            status = "verified"
            if resumes_from is None:
                resumes_from = step
                status += " (--resume continues from it)" if update == found[0][0] else (
                    " (the newest that verifies: resume from it with --set checkpoint.allow_fallback=true)")
        if args.action == "list":
            age = f"{(time.time() - manifest['created_unix']) / 3600:8.1f} h" if manifest else " " * 10
            val = manifest.get("val_loss") if manifest else None
            val_text = f"{val:.6g}" if isinstance(val, (int, float)) else "-"
            print(f"{step.name:<13}  {update:>8}  {_size(step):>12} B  {age}  {val_text:>10}  {status}")
        else:
            print(f"{step}: {status}")
    return 1 if refused and args.action == "verify" else 0
