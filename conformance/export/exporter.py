"""`export(...)`: a checkpoint's weights as a Hugging Face GPT-2, a torch state_dict or ref_jax's
Flax NNX parameter tree, in one directory (docs/export.md).

    export("runs/gpt", "hf", "out/gpt-hf")             # GPT2LMHeadModel.from_pretrained("out/gpt-hf")
    export("runs/gpt", "torch", "out/gpt-pt", ema=True) # the EMA weights, torch names

Every directory holds `twinstep.json`: the format, the checkpoint and update it came from, which
weights (model or EMA), the model spec with its sizes (enough for `build_model(ModelSpec(**...),
None)`) and the vocabulary; a gpt's directory also holds tokenizer.json and tokenizer_config.json
when the run's vocabulary is known (conformance.export.vocab).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from conformance.errors import ConfigError, PathError, UnsupportedError
from conformance.export import hf, names, vocab
from conformance.export.source import Source, read_source
from conformance.export.write import check_target, safetensors_bytes, write_directory

FORMATS = ("hf", "torch", "flax")
WEIGHTS_FILE = {"hf": "model.safetensors", "torch": "model.safetensors", "flax": "flax_model.safetensors"}


class ExportResult(NamedTuple):
    out: Path
    checkpoint: Path
    update: int
    weights: str  # "model" or "ema"
    files: tuple[str, ...]
    vocabulary: str | None  # "chars", "bytes", "tokenizer.json" or None


def _weights_file(to: str, source: Source) -> bytes:
    spec, weights = source.spec, source.weights
    if to == "hf":
        return safetensors_bytes(hf.hf_tensors(spec, weights), {"format": "pt"})
    if to == "torch":
        return safetensors_bytes(names.torch_state_dict(spec, weights), {"format": "pt"})
    return safetensors_bytes(names.flax_params(spec, weights), {"format": "flax"})


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _check_apart(out: Path, checkpoint: Path) -> None:
    """-o must neither hold the checkpoint (--force would delete the run) nor lie inside it (an
    unlisted file makes a checkpoint fail verification)."""
    target, source = out.resolve(), checkpoint.resolve()
    if target == source or target in source.parents or source in target.parents:
        raise PathError(f"-o {out} overlaps the checkpoint {checkpoint}; export to a directory outside the run's "
                        f"checkpoints (nothing was written)")


def export(run_dir: str | Path | None, to: str, out: str | Path, *, checkpoint: str | Path | None = None,
           ema: bool = False, force: bool = False, tokenizer: str | None = None) -> ExportResult:
    """Write the export directory `out` (see the module docstring); every refusal is one
    TwinstepError line, and nothing is written then."""
    if to not in FORMATS:
        raise ConfigError(f"--to must be one of {', '.join(FORMATS)}; received {to!r}")
    out = Path(out)
    check_target(out, force)  # before any checkpoint is read
    source = read_source(run_dir, checkpoint, ema)
    _check_apart(out, source.path)
    if to == "hf" and (reason := hf.refusal(source.spec)):
        raise UnsupportedError(reason)
    found = None
    if source.spec.name == "gpt":
        found = vocab.run_vocabulary(source.config, source.meta, tokenizer, source.spec.vocab_size)
    elif tokenizer is not None:
        raise ConfigError(f"--tokenizer is for a gpt; this run's model is {source.spec.name!r}")
    recorded = vocab.describe(found)
    files = {WEIGHTS_FILE[to]: _weights_file(to, source)}
    if to == "hf":
        files["config.json"] = _json(hf.hf_config(source.spec, source.weights, recorded))
    if found is not None:
        files.update(vocab.tokenizer_files(found, source.spec.block_size))
    files["twinstep.json"] = _json({
        "format": to, "weights": source.which, "checkpoint": str(source.path.resolve()), "update": source.update,
        "model": source.spec.model_dump(mode="json", exclude_none=True), "vocabulary": recorded,
        "files": sorted(files),
    })
    write_directory(out, files, force)
    return ExportResult(out, source.path, source.update, source.which, tuple(sorted(files)),
                        None if found is None else found.kind)
