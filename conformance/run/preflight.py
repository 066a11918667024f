"""Cross-field checks a run makes before it trains: what one config section alone cannot refuse.

Each is a one-line ConfigError naming the fields, raised by session.open_run on both trainers (the
same refusal whichever framework runs the config):

- the global micro-batch (world size × data.batch_size) larger than the training set (it would
  silently train full-batch);
- conformance.rules.schedules.check_schedule's refusals with the run's length (onecycle shorter than
  the run, a cosine or warm-up schedule's eta_min above a group's lr, ...): the rules the harness and
  every backend's `schedule_values` apply too;
- `run.inject_nonfinite` naming an update the run never makes;
- more updates than MAX_UPDATES (the JAX trainer counts updates in int32 on the device);
- a built-in model whose parameters, gradients and two optimizer moments do not fit in this
  machine's memory (refused before anything is allocated; the count in closed form);
- synthetic data (`data.n_samples`) whose arrays alone do not fit in this machine's memory
  (check_data_size, before the data is drawn).
"""

from __future__ import annotations

import os

from conformance.config import Config
from conformance.config.run import MAX_UPDATES
from conformance.data import DataPipeline
from conformance.data.datasets import BLOB_FEATURES
from conformance.errors import ConfigError
from conformance.rules.models import param_count
from conformance.rules.schedules import check_schedule

BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
COPIES = 4  # parameters, gradients and two optimizer moments: what training holds at least


def check_run(config: Config, data: DataPipeline, world_size: int = 1) -> None:
    """Refuse a config that cannot run as written on this data (see the module docstring)."""
    n_train = data.info.n_train
    if data.global_batch > n_train:
        ranks = f" × {world_size} ranks" if world_size > 1 else ""
        raise ConfigError(f"data.batch_size = {config.data.batch_size}{ranks} is larger than the training set "
                          f"({n_train} samples of {data.info.name}); use at most {n_train // world_size}")
    planned = data.planned_updates
    if planned > MAX_UPDATES:
        raise ConfigError(f"run.epochs = {config.run.epochs} makes {planned} updates; a run makes at most "
                          f"{MAX_UPDATES} (set run.max_updates)")
    late = [t for t in config.run.inject_nonfinite if t >= planned]
    if late:
        raise ConfigError(f"run.inject_nonfinite lists update {late[0]}, but the run makes {planned} updates "
                          f"(0..{planned - 1})")
    per_epoch = data.updates_per_epoch if config.schedule.unit == "epoch" else 1
    check_schedule(config.schedule, config.optimizer, planned, per_epoch)
    _check_memory(config, data)


# float64 values per sample of each synthetic data set: its features and its target
SYNTHETIC_VALUES = {"linear_regression": 2, "binary_blobs": BLOB_FEATURES + 1}


def check_data_size(config: Config) -> None:
    """Refuse synthetic data whose arrays alone (samples × values × 8 bytes) exceed this machine's
    memory, before any is drawn (a ConfigError naming data.n_samples, the bytes and the memory)."""
    values = SYNTHETIC_VALUES.get(config.data.name)
    n = config.data.n_samples
    have = _memory_bytes()
    if values is None or n is None or have is None:
        return
    need = n * values * 8
    if need > have:
        raise ConfigError(f"data.n_samples = {n} makes {need / 2**30:.1f} GiB of {config.data.name} samples "
                          f"({values} float64 values each); this machine has {have / 2**30:.1f} GiB "
                          f"(use fewer samples)")


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def _check_memory(config: Config, data: DataPipeline) -> None:
    try:
        n = param_count(config.model, data.info)
    except (ConfigError, ValueError, TypeError):
        return  # not a built-in model the neutral side can size
    need = n * BYTES.get(config.precision.param_dtype, 4) * COPIES
    have = _memory_bytes()
    if have is not None and need > have:
        raise ConfigError(f"model ({_sizes(config)}): {n} parameters need at least {need / 2**30:.1f} GiB with "
                          f"their gradients and optimizer state; this machine has {have / 2**30:.1f} GiB (reduce "
                          f"the model's sizes)")


def _sizes(config: Config) -> str:
    """The model fields that set its size, as the config spells them."""
    spec = config.model
    names = {"gpt": ("n_layer", "n_embd", "vocab_size", "block_size"), "mlp": ("hidden",)}.get(
        spec.name, ("in_features", "out_features"))
    shown = [f"model.{k} = {getattr(spec, k)}" for k in names if getattr(spec, k, None) is not None]
    text = ", ".join(shown)
    return text if len(text) <= 120 else text[:117] + "..."
