"""`[run]`: length of the run, device, seed, evaluation and logging cadence."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from conformance.config.base import IntIn, NonNegInt, PosInt, Section, field_error

MAX_UPDATES = 2**31 - 1  # the JAX trainer counts updates in int32 on the device


class RunSpec(Section):
    """How long to train (`epochs`, or `max_updates`, which overrides it), where (`device`), with
    which seed, and how often to evaluate (`eval_every` updates, and after the last one; 0 = never)
    on how much (`eval_batches`: a fixed subset of that many validation batches, drawn once from
    run.seed, the same at every evaluation and on every backend; unset = the whole split) and log (`log_every`: progress lines every N updates, unset = about 20 per run; metrics.jsonl
    has every update). `compile`: torch.compile
    the model (JAX always jits). `deterministic`: deterministic kernels (torch:
    use_deterministic_algorithms, cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG), which exact resume
    needs on CUDA; the CPU kernels are deterministic without it. `parallel`: how several processes
    (torchrun) share the work: "ddp" replicates the model, "fsdp" shards parameters, gradients and
    optimizer state (torch FSDP2); one process ignores it. `sync_batchnorm`: BatchNorm layers
    normalize a training micro-batch by its statistics over every process (torch SyncBatchNorm;
    the JAX trainer always does, its micro-batch being one global array), so several processes
    train as one; without it each torch process uses its own part's statistics (DDP's default).

    `inject_nonfinite` is a testing aid: every micro-batch loss of each listed update is multiplied
    by +inf before the backward pass on every backend (conformance.run.batches.injected), so a run
    exercises the skip / loss-scale path at known updates, as a float16 overflow would. Every listed
    update must be one the run makes (conformance.run.preflight checks it against the planned length).

    Integers are int64 (`seed` < 2^63); a run makes at most 2^31 - 1 updates (MAX_UPDATES)."""

    seed: NonNegInt = 0
    epochs: PosInt = 5
    max_updates: IntIn(1, MAX_UPDATES) | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    eval_every: NonNegInt = 100
    eval_batches: PosInt | None = None
    log_every: PosInt | None = None
    progress: Literal["auto", "bar", "lines", "none"] = "auto"
    tensorboard: bool = False
    loggers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=list)
    compile: bool = False
    deterministic: bool = False
    parallel: Literal["ddp", "fsdp"] = "ddp"
    sync_batchnorm: bool = False
    inject_nonfinite: list[NonNegInt] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "RunSpec":
        if len(set(self.loggers)) != len(self.loggers):
            raise field_error("loggers", f"names a logger twice: {self.loggers}")
        if self.inject_nonfinite != sorted(set(self.inject_nonfinite)):
            raise field_error("inject_nonfinite", f"must be strictly increasing update numbers; received "
                                                  f"{self.inject_nonfinite}")
        return self
