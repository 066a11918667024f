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
- the weights (model.safetensors): finite (a NaN checkpoint re-hashed by a tool passes the hashes);
- the optimizer state: an entry for every model tensor once the optimizer has stepped (none
  before; a user's model: for every trainable parameter, which the trainer checks against the live
  model on restore, check_optimizer_entries), none for a tensor the model lacks, the names and
  shapes of docs/contract.md §4 (conformance.rules.state.check_state), finite, each parameter's `step` equal to optimizer_step;
- reduce_on_plateau's state (`schedule.plateau`, conformance.rules.plateau): present exactly when
  the config's schedule is reduce_on_plateau; its counters within the schedule's patience and
  cooldown, at most one observation per update, `best` finite or (before any finite metric) the
  mode's worst, one lr per parameter group in [0, the group's starting lr];
- the weights' EMA (ema.safetensors): only with [ema]; absent while no update could have started
  it, present once more due updates have passed than updates were skipped; each tensor a model
  parameter's, of its shape, in the EMA's dtype (conformance.rules.ema.ema_dtype), finite;
- the RNG states: every rank of manifest.world_size, each with Python's (625 uint32) and NumPy's
  (624 uint32) generators and the writing framework's (torch CPU: 5056 uint8; JAX: a threefry key
  of 2 uint32), nothing unknown, their metadata present and in range.

Whatever fails is a CheckpointError naming the file and the field, e.g.
`.../step-00000020/state.json: counters.schedule_t must be in [0, 20]; received -5`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from conformance import tomlio
from conformance.checkpoint import Checkpoint
from conformance.config import Config, load_config
from conformance.errors import CheckpointError, ConfigError, InputError
from conformance.rules import plateau as plateau_rules
from conformance.rules.ema import ema_dtype, ema_due
from conformance.rules.groups import group_base_lrs, resolve_groups
from conformance.rules.inputs import first_nonfinite
from conformance.rules.schedules import start_lrs
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
PLATEAU = ("reduce_on_plateau",)


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
    _weights(path / "model.safetensors", state.model)
    _optimizer(path / "optimizer.safetensors", state.model, state.optimizer or {}, step, config)
    _plateau(w, meta["schedule"], done, config)
    _ema(path / "ema.safetensors", state.model, state.ema, done, skipped, config)
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
    plateau = frozenset({"plateau"}) if config.schedule.name in PLATEAU else frozenset()
    schedule = _table(w, "schedule", meta["schedule"], frozenset({"t"}), plateau)  # plateau: _plateau's
    if schedule["t"] != c["schedule_t"]:
        raise w.bad("schedule.t", f"counters.schedule_t = {c['schedule_t']}", schedule["t"])
    best = c["best_val_loss"]
    if best is not None and not _finite(best):
        raise w.bad("counters.best_val_loss", "a finite number or null", best)
    return skipped


def _plateau(w: _Where, schedule: dict[str, Any], done: int, config: Config) -> None:
    """reduce_on_plateau's saved state against the schedule and the run (module docstring)."""
    if config.schedule.name not in PLATEAU:
        return
    spec = config.schedule
    base = start_lrs(spec, group_base_lrs(config.optimizer))
    if "plateau" not in schedule:  # the message names state.json and the field
        plateau_rules.from_meta({"schedule": schedule}, len(base), str(w.path.parent))
    state = plateau_rules.from_json(schedule["plateau"], len(base), str(w.path))
    field = "schedule.plateau"
    _count(w, f"{field}.observed", state.observed, done)
    _count(w, f"{field}.num_bad_epochs", state.num_bad_epochs, min(spec.patience or 0, state.observed))
    _count(w, f"{field}.cooldown_counter", state.cooldown_counter, min(spec.cooldown or 0, state.observed))
    worst = math.inf if spec.mode == "min" else -math.inf
    if math.isnan(state.best) or (not math.isfinite(state.best) and state.best != worst):
        raise w.bad(f"{field}.best", f"a finite number, or {worst} before any finite metric", schedule["plateau"]["best"])
    for g, (lr, start) in enumerate(zip(state.lrs, base)):
        if not 0 <= lr <= start:
            raise w.bad(f"{field}.lrs[{g}]", f"in [0, {start}] (the group's lr, reduced by factor only)", lr)


def _ema(where: Path, model: Mapping[str, np.ndarray], ema: Mapping[str, np.ndarray] | None, done: int,
         skipped: int, config: Config) -> None:
    """The weights' EMA against [ema], the model and the counters (module docstring)."""
    spec = config.ema
    if not spec.enabled:
        if ema is not None:
            raise CheckpointError(f"{where} is present, but the checkpoint's config keeps no EMA (ema.decay unset)")
        return
    due = sum(1 for t in range(spec.start, done, spec.every) if ema_due(spec, t))
    if ema is None:
        if due > skipped:  # at most `skipped` of the due updates were skipped: one at least started it
            raise CheckpointError(f"{where} is missing: {due} updates were due to update the EMA (ema.start = "
                                  f"{spec.start}, ema.every = {spec.every}) and only {skipped} were skipped")
        return
    if due == 0:
        raise CheckpointError(f"{where} is present, but no update before {done} was due to start the EMA "
                              f"(ema.start = {spec.start})")
    for name, value in ema.items():
        if name not in model:
            raise CheckpointError(f"{where}: ema/{name} is not a tensor of model.safetensors")
        want = ema_dtype(model[name].dtype.name)
        if value.dtype.name != want or value.shape != model[name].shape:
            raise CheckpointError(f"{where}: ema/{name} must be {want} of shape {tuple(model[name].shape)}; "
                                  f"received {value.dtype.name} of shape {tuple(value.shape)}")
        if not np.isfinite(value).all():
            raise CheckpointError(f"{where}: ema/{name} holds non-finite values")


def _weights(where: Path, model: dict[str, Any]) -> None:
    # a sharded checkpoint's lazy slices are checked by their reader, on reading
    name = first_nonfinite({k: v for k, v in model.items() if not getattr(v, "lazy", False)})
    if name is not None:
        raise CheckpointError(f"{where}: model/{name} holds non-finite values; no run continues from NaN or "
                              f"inf weights (resume from an older checkpoint: twinstep checkpoint verify)")


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


def check_optimizer_entries(where: Path, trainable: Iterable[str], entries: Mapping[str, Any], step: int) -> None:
    """Every trainable parameter has its optimizer entry once the optimizer has stepped. validate_state
    applies it to a built-in model's tensors (all of them parameters); a trainer applies it to a user's
    model when it restores one (model.safetensors also holds its buffers and frozen parameters, which
    only the live model tells apart)."""
    if step > 0:
        absent = [name for name in trainable if name not in entries]
        if absent:
            raise CheckpointError(f"{where}: optimizer/{absent[0]} is missing (the optimizer has stepped "
                                  f"{step} times, so every parameter has its state; {len(absent)} missing in all)")


def _optimizer(where: Path, model: Mapping[str, np.ndarray], entries: Mapping[str, Any], step: int,
               config: Config) -> None:
    unknown = [name for name in entries if name not in model]
    if unknown:
        raise CheckpointError(f"{where}: optimizer/{unknown[0]} is not a tensor of model.safetensors")
    user = config.model.name == "user"  # a user's model: which tensors are parameters, the trainer checks
    shapes = {name: tuple(np.shape(t)) for name, t in model.items() if not user or name in entries}
    if not user:
        check_optimizer_entries(where, model, entries, step)
    if step == 0 and entries:
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
