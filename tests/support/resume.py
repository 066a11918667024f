"""What the exact-resume tests share (tests/test_resume_kill.py, tests/test_data_parallel.py,
tests/test_resume_features.py, tests/test_resume_plateau.py): the run's config, a copy of a run cut
back to a checkpoint, and the bit-for-bit comparison of two runs."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import numpy as np

from conformance import checkpoint as ck
from conformance.config import load_config
from conformance.errors import CheckpointError
from conformance.rules import plateau
from conformance.rules.groups import group_base_lrs
from conformance.rules.schedules import start_lrs
from conformance.run.metrics import read_metrics

VOLATILE = ("data_time_s", "compute_time_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes", "mfu")
WORDS = ["alpha", "beta", "gamma", "delta", "train", "resume", "exact", "twin", "step", "kill"]


def cut_after(run: Path, out: Path, update: int) -> Path:
    """A copy of `run` at `out` without the checkpoints after `update` (to resume from that one)."""
    shutil.copytree(run, out)
    for done, path in ck.list_checkpoints(out / "checkpoints"):
        if done > update:
            shutil.rmtree(path)
    return out


def write_config(tmp: Path, updates: int) -> Path:
    """The run both resume tests use: a tiny gpt with dropout, AdamW, warm-up + cosine, clipping,
    token-normalized accumulation of 2, dynamic loss scaling with injected overflows, a weights' EMA
    from update 6 on every 2nd update (evaluations on it), a checkpoint every 4 updates with
    retention."""
    corpus = tmp / "corpus.txt"
    corpus.write_text(" ".join(np.random.default_rng(0).choice(WORDS, 420)))
    path = tmp / "run.toml"
    path.write_text(f'''
[model]
name = "gpt"
n_layer = 1
n_head = 2
n_embd = 32
block_size = 16
dropout = 0.1
[data]
name = "text"
path = "{corpus}"
batch_size = 4
[optimizer]
name = "adamw"
lr = 3e-3
[schedule]
name = "warmup_cosine"
warmup_steps = 5
total_steps = {updates}
eta_min = 1e-4
[clip]
max_norm = 0.5
[accumulation]
steps = 2
normalize = "tokens"
[precision]
loss_scale = "dynamic"
init_scale = 1024.0
growth_interval = 3
[checkpoint]
every = 4
keep_last = 2
[ema]
decay = 0.9
every = 2
start = 6
evaluate = true
[run]
max_updates = {updates}
eval_every = 10
inject_nonfinite = [3, 4, 17, 30]
device = "cpu"
''')
    return path


def differences(ref: Path, got: Path, updates: int) -> list[str]:
    """Everything in which run `got` differs from run `ref` (empty: bit-identical)."""
    out: list[str] = []
    a = ck.load_checkpoint(ref / "checkpoints" / ck.step_name(updates)).state
    try:
        b = ck.load_checkpoint(got / "checkpoints" / ck.step_name(updates)).state
    except CheckpointError as exc:
        return [f"final checkpoint: {exc}"]
    if (a.ema is None) != (b.ema is None):
        out.append(f"ema: {'missing' if b.ema is None else 'unexpected'} in the final checkpoint")
    for what, x, y in (("model", a.model, b.model), ("ema", a.ema or {}, b.ema or {}),
                       *((f"optimizer {p}", a.optimizer[p], b.optimizer.get(p, {})) for p in a.optimizer)):
        for k in x:
            if k not in y or x[k].dtype != y[k].dtype or not np.array_equal(x[k], y[k]):
                out.append(f"{what} {k} differs")
    if a.meta["schedule"] != b.meta["schedule"]:  # the position, and reduce_on_plateau's state
        out.append(f"state.json schedule: {b.meta['schedule']} != {a.meta['schedule']}")
    if a.meta["loss_scale"] != b.meta["loss_scale"] or a.meta["counters"] != b.meta["counters"]:
        out.append(f"state.json: {b.meta['loss_scale']} {b.meta['counters']} != "
                   f"{a.meta['loss_scale']} {a.meta['counters']}")
    ra, rb = read_metrics(ref / "metrics.jsonl"), read_metrics(got / "metrics.jsonl")
    strip = [[{k: v for k, v in r.items() if k not in VOLATILE} for r in rs] for rs in (ra, rb)]
    if len(strip[0]) != len(strip[1]):
        out.append(f"metrics: {len(strip[1])} lines, reference {len(strip[0])}")
    for i, (x, y) in enumerate(zip(*strip)):
        if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            out.append(f"metrics line {i}: {y} != {x}")
            break
    return out


def forgotten(checkpoint: ck.Checkpoint, piece: str) -> ck.Checkpoint:
    """The checkpoint as a resume that forgot `piece` would see it: that piece back at its start.
    Plant it after conformance.run.session.pick_checkpoint (which refuses such a checkpoint)."""
    state, meta = checkpoint.state, dict(checkpoint.state.meta or {})
    if piece == "model":  # weights never restored: any other values than the saved ones
        state = state._replace(model={k: np.zeros_like(v) for k, v in state.model.items()})
    elif piece == "optimizer":  # a fresh optimizer: no per-parameter state, step 0
        state, meta = state._replace(optimizer={}), {**meta, "optimizer_step": 0}
    elif piece == "loss_scale":  # the scale and growth tracker back at their initial values
        init = load_config(tomllib.loads(state.config)).precision.init_scale
        meta["loss_scale"] = {**meta["loss_scale"], "scale": init, "growth_tracker": 0}
    elif piece == "schedule":  # the schedule rebuilt at position 0
        meta["counters"] = {**meta["counters"], "schedule_t": 0}
    elif piece == "rng":  # no generator state: each generator continues from its seed
        state = state._replace(rng={})
    elif piece == "ema":  # the weights' EMA not restored: it starts again at the next due update
        state = state._replace(ema=None)
    elif piece == "plateau":  # reduce_on_plateau rebuilt fresh: best, counters and lrs at their start
        config = load_config(tomllib.loads(state.config))
        fresh = plateau.initial(config.schedule, start_lrs(config.schedule, group_base_lrs(config.optimizer)))
        meta["schedule"] = {**meta["schedule"], "plateau": plateau.to_json(fresh)}
    return checkpoint._replace(state=state._replace(meta=meta))
