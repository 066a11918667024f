"""Every field of a checkpoint checked against the run it claims to continue, before anything is restored.

    config = validate_state(checkpoint)      # its own config, or CheckpointError naming file and field

The hashes of conformance.checkpoint prove that a checkpoint is what was written; they cannot prove
that what was written makes sense (a checkpoint re-hashed after an edit verifies). So a resume first
checks the state itself, against the checkpoint's own config (which equals the resuming run's but
for conformance.run.resume.RESUMABLE_CHANGES) and its directory:

- state.json holds exactly STATE_KEYS (`val_loss` only from format 2 on), each of its type;
- the counters agree with the step directory and with each other: updates_done = the directory's
  number = manifest.update = data.updates_done; 0 <= skipped_total <= updates_done;
  consecutive_skips <= skipped_total (and <= precision.max_consecutive_skips); the schedule position
  is updates_done - skipped_total (schedule_on_skip = "hold") or updates_done ("advance");
  optimizer_step = updates_done - skipped_total (a skipped update steps nothing);
- the data position equals the one this run computes for the update (check_data_position, called
  by session.open_run with the pipeline);
- the loss scale: present exactly when the config scales dynamically, a finite float32 > 0, a
  growth tracker in [0, growth_interval);
- the optimizer state: an entry for every model tensor once the optimizer has stepped (a built-in
  model's; a user's model also holds buffers and frozen tensors) and none before, the names and shapes of docs/contract.md §4 (conformance.rules.state.check_state),
  finite, each parameter's `step` equal to optimizer_step;
- the RNG states: every rank of manifest.world_size, each with Python's (625 uint32) and NumPy's
  (624 uint32) generators and the writing framework's (torch CPU: 5056 uint8; JAX: a threefry key
  of 2 uint32), nothing unknown, their metadata present and in range.

Whatever fails is a CheckpointError naming the file and the field, e.g.
`.../step-00000020/state.json: counters.schedule_t must be in [0, 20]; received -5`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from conformance import tomlio
from conformance.checkpoint import Checkpoint
from conformance.config import Config, load_config
from conformance.errors import CheckpointError, ConfigError, InputError
from conformance.rules.groups import resolve_groups
from conformance.rules.state import check_state

STATE_KEYS = frozenset({"backend", "optimizer_step", "schedule", "loss_scale", "data", "rng", "counters"})
COUNTER_KEYS = frozenset({"updates_done", "schedule_t", "skipped_total", "consecutive_skips", "best_val_loss"})
FLOAT32_MAX = float(np.finfo(np.float32).max)
# name -> (dtype, shape) of every RNG tensor a rank may hold; torch_cuda_<d> is matched by pattern
RNG_TENSORS: dict[str, tuple[str, tuple[int, ...]]] = {
    "python_random": ("uint32", (625,)), "numpy_global": ("uint32", (624,)),
    "torch_cpu": ("uint8", (5056,)), "jax_key": ("uint32", (2,)),
}
CUDA_RNG = re.compile(r"^torch_cuda_(\d{1,4})$")
FRAMEWORK_RNG = {"torch": "torch_cpu", "jax": "jax_key"}
JAX_IMPLS = ("threefry2x32",)
MAX_WORLD = 1 << 20


class _Where:
    """Names the file a check is about; `bad(field, want, value)` is the error."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, field: str, message: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {field} {message}")

    def bad(self, field: str, want: str, value: Any) -> CheckpointError:
        text = repr(value)
        return self(field, f"must be {want}; received {text if len(text) <= 60 else text[:57] + '...'}")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(w: _Where, field: str, value: Any, hi: int) -> int:
    if not _int(value) or not 0 <= value <= hi:
        raise w.bad(field, f"an integer in [0, {hi}]", value)
    return value


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _table(w: _Where, field: str, value: Any, keys: frozenset[str], optional: frozenset[str] = frozenset()) -> dict:
    if not isinstance(value, dict):
        raise w.bad(field, "a table", value)
    unknown = sorted(set(value) - keys - optional)
    if unknown:
        raise w(f"{field}.{unknown[0]}" if field else unknown[0], "is not a field of a twinstep checkpoint")
    missing = sorted(keys - set(value))
    if missing:
        raise w(f"{field}.{missing[0]}" if field else missing[0], "is missing")
    return value


def checkpoint_config(checkpoint: Checkpoint) -> Config:
    """The checkpoint's own config (config.toml parsed with bounded nesting and validated)."""
    where = checkpoint.path / "config.toml"
    try:
        return load_config(tomlio.parse(checkpoint.state.config, str(where), ConfigError))
    except ConfigError as exc:
        raise CheckpointError(f"{where}: the saved config is not valid: {exc}") from None


def validate_state(checkpoint: Checkpoint) -> Config:
    """Check every field of a loaded checkpoint (see the module docstring); return its config."""
    config = checkpoint_config(checkpoint)
    path, state, manifest = checkpoint.path, checkpoint.state, checkpoint.manifest
    w = _Where(path / "state.json")
    optional = frozenset({"val_loss"}) if manifest["format_version"] >= 2 else frozenset()
    meta = _table(w, "", state.meta, STATE_KEYS, optional)
    if "val_loss" in meta and meta["val_loss"] != manifest["val_loss"]:
        raise w.bad("val_loss", f"manifest.json's val_loss ({manifest['val_loss']!r})", meta["val_loss"])
    if not isinstance(meta["backend"], str) or meta["backend"] not in FRAMEWORK_RNG:
        raise w.bad("backend", f"one of {', '.join(FRAMEWORK_RNG)}", meta["backend"])
    done = state.update
    skipped = _counters(w, meta, done, config)
    step = _count(w, "optimizer_step", meta["optimizer_step"], done)
    if step != done - skipped:
        raise w.bad("optimizer_step", f"updates_done - skipped_total = {done - skipped} (a skipped update "
                                      f"steps nothing)", step)
    _loss_scale(w, meta["loss_scale"], config)
    data = meta["data"]
    if not isinstance(data, dict) or data.get("updates_done") != done:
        raise w.bad("data.updates_done", f"{done}, the checkpoint's update",
                    data.get("updates_done") if isinstance(data, dict) else data)
    _optimizer(path / "optimizer.safetensors", state.model, state.optimizer or {}, step, config)
    _rng(path, state.rng or {}, meta["rng"], manifest["world_size"], meta["backend"])
    return config


def check_data_position(saved: Any, expected: dict[str, Any], path: Path) -> None:
    """The saved data position must be exactly the one this run's pipeline computes for the same
    update (DataPipeline.position: the position is a pure function of the update count), but for
    the world size, which a resume may change when the global batch stays the same."""
    w = _Where(path / "state.json")
    saved = _table(w, "data", saved, frozenset(expected))
    for key in sorted(set(expected) - {"world_size"}):
        want, got = expected[key], saved[key]
        if got != want or type(got) is not type(want):
            raise w.bad(f"data.{key}", f"{want!r}, the data position after {expected['updates_done']} updates", got)
    if not _int(saved["world_size"]) or not 1 <= saved["world_size"] <= MAX_WORLD:
        raise w.bad("data.world_size", f"an integer in [1, {MAX_WORLD}]", saved["world_size"])


def _counters(w: _Where, meta: dict[str, Any], done: int, config: Config) -> int:
    c = _table(w, "counters", meta["counters"], COUNTER_KEYS)
    if c["updates_done"] != done:
        raise w.bad("counters.updates_done", f"{done}, the update of the checkpoint's directory and manifest",
                    c["updates_done"])
    skipped = _count(w, "counters.skipped_total", c["skipped_total"], done)
    limit = config.precision.max_consecutive_skips
    _count(w, "counters.consecutive_skips", c["consecutive_skips"], min(skipped, limit if limit is not None else skipped))
    hold = config.precision.schedule_on_skip == "hold"
    position = done - skipped if hold else done
    _count(w, "counters.schedule_t", c["schedule_t"], done)
    if c["schedule_t"] != position:
        rule = "updates_done - skipped_total (schedule_on_skip = 'hold')" if hold else "updates_done ('advance')"
        raise w.bad("counters.schedule_t", f"{position} = {rule}", c["schedule_t"])
    schedule = _table(w, "schedule", meta["schedule"], frozenset({"t"}))
    if schedule["t"] != c["schedule_t"]:
        raise w.bad("schedule.t", f"counters.schedule_t = {c['schedule_t']}", schedule["t"])
    best = c["best_val_loss"]
    if best is not None and not _finite(best):
        raise w.bad("counters.best_val_loss", "a finite number or null", best)
    return skipped


def _loss_scale(w: _Where, saved: Any, config: Config) -> None:
    spec = config.precision
    if not spec.dynamic_scaling:
        if saved is not None:
            raise w.bad("loss_scale", "null (the config does not scale the loss dynamically)", saved)
        return
    s = _table(w, "loss_scale", saved, frozenset({"scale", "growth_tracker"}))
    if not _finite(s["scale"]) or not 0 < s["scale"] <= FLOAT32_MAX:
        raise w.bad("loss_scale.scale", "a finite float32 > 0", s["scale"])
    _count(w, "loss_scale.growth_tracker", s["growth_tracker"], spec.growth_interval - 1)


def _optimizer(where: Path, model: Mapping[str, np.ndarray], entries: Mapping[str, Any], step: int,
               config: Config) -> None:
    shapes = {name: tuple(np.shape(t)) for name, t in model.items()}
    # A built-in model's tensors are all parameters; a user's model (name = "user") also checkpoints
    # buffers, frozen parameters and NNX state, which have no optimizer state (nor has a parameter
    # that never received a gradient), so there only the entries present are checked.
    if step > 0:
        absent = [name for name in model if name not in entries] if config.model.name != "user" else []
        if absent:
            raise CheckpointError(f"{where}: optimizer/{absent[0]} is missing (the optimizer has stepped "
                                  f"{step} times, so every parameter has its state; {len(absent)} missing in all)")
    elif entries:
        raise CheckpointError(f"{where}: optimizer/{next(iter(entries))} is present, but the optimizer has not "
                              f"stepped yet (optimizer_step = 0)")
    try:
        check_state(resolve_groups(config.optimizer, shapes), shapes, entries)
    except (InputError, ConfigError) as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    for name, entry in entries.items():
        got = np.asarray(entry["step"])
        if got.dtype.kind not in "iu" or int(got) != step:
            raise CheckpointError(f"{where}: optimizer/{name}/step must be {step} (optimizer_step); received "
                                  f"{got.tolist()!r}")


def _rng(path: Path, tensors: Mapping[str, np.ndarray], meta: Any, world: int, backend: str) -> None:
    where, w = path / "rng.safetensors", _Where(path / "state.json")
    ranks = frozenset(f"rank{r}" for r in range(world))
    meta = _table(w, "rng", meta, ranks)
    by_rank: dict[str, dict[str, np.ndarray]] = {r: {} for r in ranks}
    for key, value in tensors.items():
        rank, _, name = key.partition("/")
        if rank not in by_rank or not (name in RNG_TENSORS or CUDA_RNG.match(name)):
            raise CheckpointError(f"{where}: tensor rng/{key} is not an RNG state of a rank in 0..{world - 1}")
        by_rank[rank][name] = value
    for rank in sorted(ranks):
        mine = by_rank[rank]
        for name in ("python_random", "numpy_global", FRAMEWORK_RNG[backend]):
            if name not in mine:
                raise CheckpointError(f"{where}: rng/{rank}/{name} is missing (the {backend} trainer saves it "
                                      f"for every rank)")
        for name, value in mine.items():
            dtype, shape = RNG_TENSORS.get(name, ("uint8", (16,)))
            if value.dtype.name != dtype or tuple(value.shape) != shape:
                raise CheckpointError(f"{where}: rng/{rank}/{name} must be {dtype} of shape {shape}; received "
                                      f"{value.dtype.name} of shape {tuple(value.shape)}")
        _rng_meta(w, f"rng.{rank}", meta[rank], frozenset(n for n in mine if n in ("python_random", "numpy_global",
                                                                                   "jax_key")))


def _rng_meta(w: _Where, field: str, meta: Any, names: frozenset[str]) -> None:
    meta = _table(w, field, meta, names)
    py = _table(w, f"{field}.python_random", meta["python_random"], frozenset({"version", "gauss_next"}))
    if py["version"] != 3:
        raise w.bad(f"{field}.python_random.version", "3 (Python's Mersenne Twister state)", py["version"])
    if py["gauss_next"] is not None and not _finite(py["gauss_next"]):
        raise w.bad(f"{field}.python_random.gauss_next", "a finite number or null", py["gauss_next"])
    np_ = _table(w, f"{field}.numpy_global", meta["numpy_global"],
                 frozenset({"kind", "pos", "has_gauss", "cached_gaussian"}))
    if np_["kind"] != "MT19937":
        raise w.bad(f"{field}.numpy_global.kind", "'MT19937'", np_["kind"])
    _count(w, f"{field}.numpy_global.pos", np_["pos"], 624)
    _count(w, f"{field}.numpy_global.has_gauss", np_["has_gauss"], 1)
    if not _finite(np_["cached_gaussian"]):
        raise w.bad(f"{field}.numpy_global.cached_gaussian", "a finite number", np_["cached_gaussian"])
    if "jax_key" in meta:
        key = _table(w, f"{field}.jax_key", meta["jax_key"], frozenset({"impl", "typed"}))
        if key["impl"] not in JAX_IMPLS or not isinstance(key["typed"], bool):
            raise w.bad(f"{field}.jax_key", f"impl one of {JAX_IMPLS} and typed a boolean", key)
