"""`[data]`: the shared NumPy data pipeline (both backends train on the same batches).

    [data]
    name = "binary_blobs"   # linear_regression | binary_blobs | digits | text | tokens | arrays | user
    batch_size = 64         # micro-batch per rank; global batch = world size × this × accumulation.steps

    [data]                  # llm.c / modded-nanogpt token shards, memory-mapped
    name = "tokens"
    path = "shards/train_*.bin"
    val_path = "shards/val_*.bin"

Dataset-dependent defaults (`n_samples`, `val_fraction`) are filled in when the section is read, so
the resolved config states them. `user` is what a run records when `train(..., data=...)` was given
the data itself (docs/your_model.md); a config never names it to get data. Semantics:
docs/models.md ("Data").
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from conformance.config.base import FloatIn, NonNegInt, PosInt, Section, field_error

DatasetName = Literal["linear_regression", "binary_blobs", "digits", "text", "tokens", "arrays", "user"]
DATASET_NAMES: tuple[str, ...] = DatasetName.__args__  # type: ignore[attr-defined]

SYNTHETIC = ("linear_regression", "binary_blobs")
LANGUAGE = ("text", "tokens")  # windows of block_size + 1 tokens over a stream
FILES = ("text", "tokens", "arrays")  # data read from `path`

# Per-dataset defaults, from the seeds: seed 001 trains y = 3x + 2 on 64 points (no validation);
# seed 000 draws 4096 + 1024 samples. Data in files or passed in validates only when asked to.
DEFAULT_N_SAMPLES: dict[str, int] = {"linear_regression": 64, "binary_blobs": 5120}
DEFAULT_VAL_FRACTION: dict[str, float] = {
    "linear_regression": 0.0,
    "binary_blobs": 0.2,
    "digits": 0.2,
    "text": 0.1,
    "arrays": 0.0,
    "user": 0.0,
}

USED_BY: dict[str, tuple[str, ...]] = {
    "n_samples": SYNTHETIC,
    "path": FILES,
    "val_path": ("tokens", "arrays"),
    "val_fraction": tuple(n for n in DATASET_NAMES if n != "tokens"),
    "corpus": ("text",),
    "block_size": LANGUAGE,
    "stride": LANGUAGE,
    "inputs": ("arrays", "user"),
    "targets": ("arrays", "user"),
}


class DataSpec(Section):
    """A dataset and how it is batched. `batch_size` is the micro-batch per rank; `eval_batch_size`
    defaults to it. `seed` draws synthetic data and the train/validation split (default: run.seed);
    the shuffle order always comes from run.seed and the epoch. `drop_last` drops each epoch's
    incomplete last global micro-batch. Text: `path` (a UTF-8 file) or `corpus`, a built-in text:
    "python_help" (Python's help topics, the default) or "tinyshakespeare" (nanoGPT's
    shakespeare_char corpus, shipped with twinstep), `block_size` (default: model.block_size) and `stride` between windows (default:
    block_size). Tokens: `path` and `val_path` are globs of llm.c token shards (a header of 256
    int32: magic 20240520, version 1, token count; then uint16 tokens), windows of block_size + 1
    tokens that stay inside one shard. Arrays: `path` (and `val_path`) an .npz file or a directory
    of .npy files, memory-mapped, one entry per name. Arrays and data passed to train(): `inputs`
    names the entry the model is called on, `targets` the entry `[loss]` compares its output with."""

    name: DatasetName = "binary_blobs"
    batch_size: PosInt = 64
    eval_batch_size: PosInt | None = None
    n_samples: PosInt | None = None
    val_fraction: FloatIn(0.0, 1.0, hi_open=True) | None = None
    seed: NonNegInt | None = None
    shuffle: bool = True
    drop_last: bool = False
    path: str | None = None
    val_path: str | None = None
    corpus: Literal["python_help", "tinyshakespeare"] | None = None
    block_size: PosInt | None = None
    stride: PosInt | None = None
    inputs: str = "x"
    targets: str = "y"

    @model_validator(mode="after")
    def _check(self) -> "DataSpec":
        # Dataset-dependent defaults are filled in here so that dump_config writes them out, but
        # not marked as set: model_fields_set keeps what the config itself said (run.objects reads it).
        if self.n_samples is None and self.name in DEFAULT_N_SAMPLES:
            object.__setattr__(self, "n_samples", DEFAULT_N_SAMPLES[self.name])
        if self.val_fraction is None and self.name in DEFAULT_VAL_FRACTION and not (
                self.name == "arrays" and self.val_path is not None):
            object.__setattr__(self, "val_fraction", DEFAULT_VAL_FRACTION[self.name])
        self.reject_unused(USED_BY, "name")
        for field in ("path", "val_path"):
            value = getattr(self, field)
            if value is not None and not value.strip():
                raise field_error(field, "must name a file, a directory or a glob; omit it instead of leaving it empty")
        if self.corpus is not None and self.path is not None:
            raise field_error("corpus", "and data.path both name the text; keep one")
        if self.name in ("tokens", "arrays") and self.path is None:
            what = "a glob of token shards" if self.name == "tokens" else "an .npz file or a directory of .npy files"
            raise field_error("path", f"is required with name = {self.name!r} ({what})")
        if self.name == "arrays" and self.val_path is not None and self.val_fraction:
            raise field_error("val_fraction", "cannot split off validation samples when val_path names them")
        for field in ("inputs", "targets"):
            if not getattr(self, field).strip():
                raise field_error(field, "must name an entry of the data, e.g. 'x'")
        return self
