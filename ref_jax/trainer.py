"""The trainer: `train(config, out_dir)` runs a whole training config and writes docs/contract.md §5's files.

    result = train("configs/linear_regression.toml", "runs/lr")          # or a Config, or None
    result = train(config, "runs/lr", resume=True)                        # continue from the newest checkpoint

Both backends run the same configs, write the same metrics lines and checkpoints (either resumes
the other's) and agree to the tolerance of the dtype (docs/jax_trainer.md). The run is written
once, in conformance.run.loop: opening the directory with every rank agreeing, and after each
update its metrics line, evaluation, best validation loss and checkpoint or stop, in that order.
A trainer supplies only its framework steps (`_steps.Steps`: update, evaluate, observe, save,
peak_memory_bytes, final_params):

    run = open_on_every_rank(agree, ...)          # DIR/config.toml, data, checkpoint to resume, metrics
    drive(run, Steps(run, ...))                  # model, optimizer, schedule, loss scale built, then
                                                  # restored from run.checkpoint if resuming; update t:
                                                  # window t → scale → gradients over the window →
                                                  # unscale → finite check → clip → step or skip →
                                                  # scaler → schedule

torch: ref_torch._update.apply_update per update; one process per rank (torchrun: DDP or FSDP).
JAX: ONE jitted, donating step for the whole update (ref_jax._train_step), the schedule position
on the device; the host lays out window t + 1 at one fixed shape while the device computes update
t. Every device of run.device in one Mesh, each batch split over them (ref_jax._parallel); global
batch = data.batch_size × accumulation.steps whatever their number, × the number of processes under
torchrun (as torch's ranks). Precision: numerics_context
wraps the run (64-bit types only for float64 runs), bfloat16/float16 through the dtype Policy.

Contract shared by every backend's `train` (same signature and docstring):

- `config`: a Config, a TOML path, a mapping, or None for the built-in default.
- `model`: a model of your own instead of `[model]` (docs/your_model.md): torch, any
  torch.nn.Module (moved to run.device and cast to precision.param_dtype in place: the object you
  pass is the one trained); JAX, a Flax NNX module, or the pure form `(apply_fn, params)` with
  apply_fn(params, inputs) -> output over any pytree of parameters (linen: `(model.apply,
  variables)`). Neutral names: torch's named_parameters() and persistent buffers; JAX pytree paths
  joined with "." (NNX: `conv1.kernel`; linen: `params.Dense_0.kernel`), renamed by
  `[model] rename`. Buffers and NNX non-parameter state (BatchStat, RNG counters) are checkpointed.
  The config must not name a built-in model as well (omit `[model]`, or `name = "user"`).
- `data`: data of your own instead of `[data] name`: a mapping of NumPy arrays (np.memmap too)
  with a common first axis (`{"x", "y"}`: `[data] inputs` / `targets` name the entries), any object
  with `__len__`, `take(indices) -> {name: array}` and `fingerprint` (conformance.data.sources), or
  a pair (train, validation). Batches come from the same pipeline as the built-in data sets.
- `loss_fn(output, batch) -> (sum, count)`: replaces `[loss]` (which compares model(inputs) with the
  targets); `batch` holds every entry of the micro-batch as framework arrays plus `sample_mask`
  (True for real samples; the JAX trainer pads short micro-batches with False rows, which must not
  count). Return the loss summed over the batch and the count it averages over, so accumulation
  and data parallelism normalize once.
- `out_dir` gets config.toml, metrics.jsonl and checkpoints/ (only rank 0 writes files).
- `resume`: continue from the newest checkpoint that verifies (docs/contract.md §5); without it an
  `out_dir` that already holds checkpoints is refused (CheckpointError), nothing is overwritten.
- `rank`, `world_size`: None = from the launcher's environment (RANK / WORLD_SIZE, set by
  torchrun), else 0 and 1. Both trainers run as one process per rank under torchrun (torch: DDP
  or FSDP2; JAX: jax.distributed, one mesh over every process's devices); a world above 1 without
  the launcher's MASTER_ADDR / MASTER_PORT is a ConfigError.
  `progress`: "auto" | "bar" | "lines" | "none"; None = run.progress.
- `events(name, info)`: called at the run's named moments (conformance.events: micro-batches
  or dispatched windows, checkpoint stages); None = nobody watches.
- `[run] inject_nonfinite = [t, ...]`: every micro-batch loss (value and sum) of each listed
  update is multiplied by +inf before the backward pass (conformance.run.batches.injected), so the
  window loss is +inf and the gradients non-finite, as in a float16 overflow: the update is skipped
  under on_nonfinite = "skip" (the loss scale backs off under dynamic scaling) and stops the run
  with NonFiniteError under on_nonfinite = "raise" or beyond max_consecutive_skips.
- `[schedule] name = "reduce_on_plateau"` observes `schedule.monitor` (val_loss, or val_accuracy)
  after every evaluation, so updates after it apply the reduced lrs; a run that never evaluates is
  refused (ConfigError naming run.eval_every or data.val_fraction); its state (best metric,
  counters, every group's lr) is in every checkpoint, in the neutral form of
  conformance.rules.plateau, so either trainer resumes it exactly.
- Returns TrainResult(params, losses, updates_done, out_dir, checkpoint): the final parameters as
  NumPy arrays in their own dtype by neutral name, the loss of every update this call ran (so a
  resumed call returns only the updates after the checkpoint), the number of updates done, the
  output directory and the last checkpoint written (None if none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conformance.config import Config, load_config
from conformance.events import Events
from conformance.run.loop import drive, open_on_every_rank, resolve_world
from conformance.run.objects import given_dataset, resolve_config
from conformance.run.session import TrainResult
from ref_jax._parallel import gather_bytes, setup, teardown
from ref_jax._steps import Steps
from ref_jax.precision import numerics_context

__all__ = ["train"]


def _as_config(config: Config | str | Path | Mapping[str, Any] | None) -> Config:
    return config if isinstance(config, Config) else load_config(config)


def train(config: Config | str | Path | Mapping[str, Any] | None, out_dir: str | Path, *, model: Any = None,
          data: Any = None, loss_fn: Callable[[Any, Any], Any] | None = None, resume: bool = False,
          rank: int | None = None, world_size: int | None = None, progress: str | None = None,
          events: Events | None = None) -> TrainResult:
    """Train `config` (and the model, data and loss_fn given, if any) into `out_dir` and return a
    TrainResult (see the module docstring: your own model and data, files, resume, ranks, progress,
    events, inject_nonfinite). Raises the errors of conformance.errors: ConfigError for a config that
    cannot run, InputError for unusable data or model, CheckpointError for a refused resume,
    NonFiniteError under the non-finite policy; files already written stay intact."""
    config = resolve_config(_as_config(config), model is not None, data is not None)
    rank_, world, _ = resolve_world(rank, world_size)
    dataset = given_dataset(config, data, loss_fn is not None)
    created = setup(rank_, world, config.run.device)  # torchrun: one JAX process per rank, one mesh over all
    try:
        with numerics_context(config.precision):
            run = open_on_every_rank(lambda ok: _all(ok, world), config, out_dir, "jax", resume=resume, rank=rank_,
                                     world_size=world, progress=progress or config.run.progress, events=events,
                                     dataset=dataset, check_loss=loss_fn is None)
            try:
                return drive(run, Steps(run, model, loss_fn))
            finally:
                run.close()
    finally:
        teardown(created)


def _all(ok: bool, world: int) -> bool:
    """True when every process reports ok."""
    return ok if world == 1 else all(b == b"1" for b in gather_bytes(b"1" if ok else b"0"))
