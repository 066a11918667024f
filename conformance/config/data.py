"""`[data]`: the shared NumPy data pipeline (both backends train on the same batches).

    [data]
    name = "binary_blobs"   # linear_regression | binary_blobs | digits | text
    batch_size = 64         # micro-batch per rank; global batch = world size × this × accumulation.steps

Dataset-dependent defaults (`n_samples`, `val_fraction`) are filled in when the section is read, so
the resolved config states them. Semantics: docs/models.md ("Data").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from conformance.config.base import FloatIn, NonNegInt, PosInt, Section, field_error

DatasetName = Literal["linear_regression", "binary_blobs", "digits", "text"]
DATASET_NAMES: tuple[str, ...] = DatasetName.__args__  # type: ignore[attr-defined]

SYNTHETIC = ("linear_regression", "binary_blobs")

# Per-dataset defaults, from the seeds: seed 001 trains y = 3x + 2 on 64 points (no validation);
# seed 000 draws 4096 + 1024 samples.
DEFAULT_N_SAMPLES: dict[str, int] = {"linear_regression": 64, "binary_blobs": 5120}
DEFAULT_VAL_FRACTION: dict[str, float] = {
    "linear_regression": 0.0,
    "binary_blobs": 0.2,
    "digits": 0.2,
    "text": 0.1,
}

USED_BY: dict[str, tuple[str, ...]] = {
    "n_samples": SYNTHETIC,
    "path": ("text",),
    "block_size": ("text",),
    "stride": ("text",),
}


class DataSpec(Section):
    """A dataset and how it is batched. `batch_size` is the micro-batch per rank; `eval_batch_size`
    defaults to it. `seed` draws synthetic data and the train/validation split (default: run.seed);
    the shuffle order always comes from run.seed and the epoch. `drop_last` drops each epoch's
    incomplete last global micro-batch. Text: `path` (a UTF-8 file; default: a corpus shipped with
    Python), `block_size` (default: model.block_size) and `stride` between windows (default:
    block_size)."""

    name: DatasetName = "binary_blobs"
    batch_size: PosInt = 64
    eval_batch_size: PosInt | None = None
    n_samples: PosInt | None = None
    val_fraction: FloatIn(0.0, 1.0, hi_open=True) | None = None
    seed: NonNegInt | None = None
    shuffle: bool = True
    drop_last: bool = False
    path: str | None = None
    block_size: PosInt | None = None
    stride: PosInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        # Resolve dataset-dependent defaults here so that dump_config writes them out.
        if not isinstance(data, dict):
            return data
        name = data.get("name", "binary_blobs")
        if not isinstance(name, str):
            return data
        out = dict(data)
        if "n_samples" not in out and name in DEFAULT_N_SAMPLES:
            out["n_samples"] = DEFAULT_N_SAMPLES[name]
        if "val_fraction" not in out and name in DEFAULT_VAL_FRACTION:
            out["val_fraction"] = DEFAULT_VAL_FRACTION[name]
        return out

    @model_validator(mode="after")
    def _check(self) -> "DataSpec":
        self.reject_unused(USED_BY, "name")
        if self.path is not None and not self.path.strip():
            raise field_error("path", "must name a UTF-8 text file; omit it for the built-in corpus")
        return self
