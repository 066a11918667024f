"""The data pipeline both trainers loop over: "the window of micro-batches for update t".

    data = DataPipeline(config, rank=0, world_size=1)
    for t in range(data.planned_updates):
        window = data.window(t)            # accumulation window of update t, this rank's part
        for batch in window.batches:       # NumPy x, y (and every entry in batch.fields); identical on every backend
            ...

There is no iterator state: update t fully determines the epoch, the shuffle (a pure function of
run.seed and the epoch) and the micro-batches, so a resumed run asks for window(t) and gets the
same batches. Global batch = world_size × data.batch_size × accumulation.steps, and the ranks'
parts of each global micro-batch together are exactly the one-process micro-batch of that size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from conformance.config import Config
from conformance.data import sampling
from conformance.data.datasets import load_dataset
from conformance.data.splits import DataInfo, Dataset
from conformance.errors import CheckpointError, ConfigError


class Batch(NamedTuple):
    """One micro-batch on one rank. `x`, `y`: the entries data.inputs and data.targets name (y None
    when the data has no targets: a loss_fn reads `fields`); `index`: its samples' positions in the
    split; `epoch` and `micro_batch` (within the epoch) locate it; `global_size`: samples in this
    micro-batch over all ranks (a rank's part can be empty when a short last micro-batch has fewer
    samples than ranks); `fields`: every entry the data's take() gave (None: just x and y)."""

    x: np.ndarray
    y: np.ndarray | None
    index: np.ndarray
    epoch: int
    micro_batch: int
    global_size: int
    fields: Mapping[str, np.ndarray] | None = None


class Window(NamedTuple):
    """The micro-batches of one optimizer update on one rank (fewer than accumulation.steps only in
    an epoch's incomplete last window, with accumulation.last_window = "update"); `global_samples`
    counts every rank's samples."""

    update: int
    epoch: int
    window: int
    batches: tuple[Batch, ...]
    global_samples: int


def _check_models(config: Config) -> None:
    model, data = config.model, config.data
    if data.name in ("text", "tokens") and model.name not in ("gpt", "user"):
        raise ConfigError(f"model.name: the {data.name} data set needs model.name = 'gpt' (or a model passed to "
                          f"train()); received {model.name!r}")
    if model.name == "gpt" and data.name not in ("text", "tokens", "user"):
        raise ConfigError(f"data.name: model gpt needs a language data set (text, tokens); received {data.name!r}")
    if data.block_size is not None and model.name == "gpt" and data.block_size > model.block_size:
        raise ConfigError(
            f"data.block_size = {data.block_size} exceeds model.block_size = {model.block_size} "
            f"(the position embedding has {model.block_size} rows)"
        )


class DataPipeline:
    """Batches for one rank of a run, from the config alone (see the module docstring)."""

    def __init__(self, config: Config, rank: int = 0, world_size: int = 1,
                 dataset: Dataset | None = None) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        _check_models(config)
        spec = config.data
        self.config, self.rank, self.world_size = config, rank, world_size
        self.seed = config.run.seed
        self.data_seed = spec.seed if spec.seed is not None else config.run.seed
        block = spec.block_size or config.model.block_size
        vocab = config.model.vocab_size if config.model.name == "gpt" else None
        self.dataset = dataset if dataset is not None else load_dataset(spec, self.data_seed, block, vocab)
        self.steps = config.accumulation.steps
        self.global_batch = world_size * spec.batch_size
        self.bounds = sampling.micro_batch_bounds(len(self.dataset.train), self.global_batch, spec.drop_last)
        # accumulation.last_window decides whether an incomplete last window is an update or dropped
        self.updates_per_epoch = config.accumulation.updates_per_epoch(len(self.bounds))
        if self.updates_per_epoch == 0:
            n = len(self.dataset.train)
            raise ConfigError(
                f"data.batch_size = {spec.batch_size} is too large: {n} training samples make "
                f"{len(self.bounds)} micro-batch(es) of {self.global_batch} (world size {world_size}"
                f"{', drop_last' if spec.drop_last else ''}), not one update of {self.steps} "
                f"(accumulation.steps, last_window = {config.accumulation.last_window!r})"
            )
        self._window_sizes = sampling.window_sizes(self.bounds, self.steps, self.updates_per_epoch)
        self._order: tuple[int, Any] | None = None  # memo of the current epoch's order
        run = config.run
        self.planned_updates = run.epochs * self.updates_per_epoch if run.max_updates is None else run.max_updates

    @property
    def info(self) -> DataInfo:
        return self.dataset.info

    def locate(self, update: int) -> tuple[int, int]:
        """(epoch, window within the epoch) of update t."""
        if update < 0:
            raise ConfigError(f"update must be >= 0; received {update}")
        return divmod(update, self.updates_per_epoch)

    def window(self, update: int) -> Window:
        """This rank's micro-batches for update t (a pure function of the config, rank and t)."""
        epoch, w = self.locate(update)
        if self._order is None or self._order[0] != epoch:
            n = len(self.dataset.train)
            self._order = (epoch, sampling.epoch_order(self.seed, epoch, n, self.config.data.shuffle))
        order = self._order[1]
        take, bounds, rank, world = self.dataset.train.take, self.bounds, self.rank, self.world_size
        inputs, targets = self.config.data.inputs, self.config.data.targets
        batches = []
        for j in sampling.window_micro_batches(w, self.steps, len(bounds)):
            start, stop = bounds[j]
            part = order[start:stop] if world == 1 else sampling.shard(order[start:stop], rank, world)
            fields = take(part)
            batches.append(Batch(fields[inputs], fields.get(targets), part, epoch, j, stop - start, fields))
        return Window(update, epoch, w, tuple(batches), self._window_sizes[w])

    def samples_seen(self, updates_done: int) -> int:
        """Samples consumed by all ranks in updates 0 .. updates_done - 1."""
        epochs, rest = divmod(updates_done, self.updates_per_epoch)
        return epochs * self._window_sizes.total() + self._window_sizes.first(rest)

    def val_batches(self) -> Iterator[Batch]:
        """This rank's validation batches, in order, every sample once (no shuffle, no drop); with
        run.eval_batches = N, the N of them `eval_subset` chooses."""
        n = len(self.dataset.val)
        step = self._val_step()
        starts = list(range(0, n, step))
        chosen = self.eval_subset()
        for j in (range(len(starts)) if chosen is None else chosen):
            start = starts[j]
            part = sampling.shard(np.arange(start, min(start + step, n)), self.rank, self.world_size)
            yield self._batch(self.dataset.val.take(part), part, 0, j, min(start + step, n) - start)

    def eval_subset(self) -> list[int] | None:
        """The validation batches run.eval_batches = N evaluates, by index in val_batches' order:
        N drawn without replacement from run.seed, sorted, the same at every evaluation, on every
        rank and backend (a pure function of the config); None = every batch (unset, or N at least
        their number)."""
        wanted = self.config.run.eval_batches
        total = -(-len(self.dataset.val) // self._val_step())
        if wanted is None or wanted >= total:
            return None
        return sorted(int(j) for j in sampling.random_order(self.seed, "eval_batches", total)[:wanted])

    def _val_step(self) -> int:
        return (self.config.data.eval_batch_size or self.config.data.batch_size) * self.world_size

    def _batch(self, fields: Mapping[str, np.ndarray], index: np.ndarray, epoch: int, j: int, size: int) -> Batch:
        spec = self.config.data
        return Batch(fields[spec.inputs], fields.get(spec.targets), index, epoch, j, size, fields)

    def position(self, updates_done: int) -> dict[str, Any]:
        """The data position after `updates_done` updates, as JSON for a checkpoint."""
        epoch, w = self.locate(updates_done)
        return {
            "updates_done": updates_done,
            "epoch": epoch,
            "window_in_epoch": w,
            "first_micro_batch": w * self.steps,
            "samples_seen": self.samples_seen(updates_done),
            "global_micro_batch": self.global_batch,
            "accumulation_steps": self.steps,
            "world_size": self.world_size,
            "shuffle_seed": self.seed,
            "dataset": self.info.name,
            "fingerprint": self.info.fingerprint,
        }

    def check_position(self, saved: dict[str, Any]) -> None:
        """Refuse to resume from a data position that this pipeline would not reproduce."""
        mine = self.position(int(saved.get("updates_done", 0)))
        for key, field in (("fingerprint", "data"), ("shuffle_seed", "run.seed"),
                           ("global_micro_batch", "data.batch_size"), ("accumulation_steps", "accumulation.steps")):
            if saved.get(key) != mine[key]:
                raise CheckpointError(
                    f"checkpoint data position: {key} was {saved.get(key)!r}, this run has {mine[key]!r} "
                    f"({field} changed, so update {mine['updates_done']} would not see the same batches)"
                )


def batch_hash(batch: Batch | Window) -> str:
    """16 hex digits of sha256 over a batch's (or a window's) inputs and targets, for logs."""
    batches = batch.batches if isinstance(batch, Window) else (batch,)
    digest = hashlib.sha256()
    for b in batches:
        extra = [] if b.fields is None else [v for _, v in sorted(b.fields.items()) if v is not b.x and v is not b.y]
        arrays = [b.x, *([] if b.y is None else [b.y]), *extra]
        digest.update(sampling.fingerprint(*(np.asarray(a) for a in arrays)).encode("ascii"))
    return digest.hexdigest()[:16]


def updates_per_epoch(config: Config, world_size: int = 1) -> int:
    """Optimizer updates per epoch: the single source of truth both trainers and schedules use."""
    return DataPipeline(config, 0, world_size).updates_per_epoch


def planned_updates(config: Config, world_size: int = 1) -> int:
    """Updates the run will make: run.max_updates when set (it overrides run.epochs, and the data
    cycles through as many epochs as needed), else run.epochs × updates_per_epoch."""
    return DataPipeline(config, 0, world_size).planned_updates
