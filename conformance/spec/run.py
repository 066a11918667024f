"""`[run]`: length of the run, device, seed, evaluation and logging cadence."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from conformance.spec.base import NonNegInt, PosInt, Section, field_error


class RunSpec(Section):
    """How long to train (`epochs`, or `max_updates`, which overrides it), where (`device`), with
    which seed, and how often to evaluate (`eval_every` updates, 0 = never) and log.

    `inject_nonfinite` is a testing aid: the loss of each listed update is replaced by +inf on every
    backend, so a run exercises the skip / loss-scale path at known updates."""

    seed: NonNegInt = 0
    epochs: PosInt = 5
    max_updates: PosInt | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    eval_every: NonNegInt = 0
    log_every: PosInt = 1
    progress: Literal["auto", "bar", "lines", "none"] = "auto"
    tensorboard: bool = False
    compile: bool = False
    inject_nonfinite: list[NonNegInt] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> "RunSpec":
        if self.inject_nonfinite != sorted(set(self.inject_nonfinite)):
            raise field_error("inject_nonfinite", f"must be strictly increasing update numbers; received "
                                                  f"{self.inject_nonfinite}")
        return self
