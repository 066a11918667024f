"""`[model] init`: the weights a fresh run of a built-in model starts from (fine-tuning).

    [model]
    name = "gpt"
    init = "runs/gpt2-hf"        # a Hugging Face GPT-2 directory, a .safetensors / .pt / .bin file, a checkpoint

`init` names a file the weight reader of `twinstep port weights` reads (conformance/port/read/
weights.py: neutral or torch names, nanoGPT's checkpoints, Hugging Face GPT-2's Conv1D layout, Flax
trees; torch files with weights_only=True, never plain pickle), or a directory holding
`model.safetensors` (a Hugging Face model directory, a `twinstep export` directory, a twinstep
checkpoint) or else `pytorch_model.bin`. The model's sizes come from [model] and the data as
always; every tensor must be present with the shape they give, or the run is refused naming the
tensor. Beside a Hugging Face GPT-2's weights, its config.json is checked against [model] first:
a size that differs is refused naming both (n_head above all, which no tensor's shape shows: the
same weights split into other heads are another model), and an activation other than exact GELU
(GPT-2's own "gelu_new" is tanh's approximation; the built-in gpt, as nanoGPT, uses exact GELU) is
one warning line. Both trainers call `initial_weights` only on a fresh start: a resumed run takes
its weights from its checkpoint and needs the file no more.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from conformance.config import Config
from conformance.config.model import ModelSpec
from conformance.data.splits import DataInfo
from conformance.errors import InputError, TwinstepError, TwinstepWarning
from conformance.files import read_regular
from conformance.rules.models import model_dims

DIRECTORY_FILES = ("model.safetensors", "pytorch_model.bin")  # what a model directory holds, in that order
# [model] field -> GPT2Config field
HF_SIZES = {"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd", "block_size": "n_positions",
            "vocab_size": "vocab_size"}


def weights_file(init: str) -> Path:
    """The file `init` names: itself, or the weights inside the directory it names."""
    # links are followed: a Hugging Face cache's snapshot directories hold links to its blobs
    path = Path(init).expanduser()
    if path.is_dir():
        for name in DIRECTORY_FILES:
            if (path / name).is_file():
                return path / name
        raise InputError(f"model.init: {path} holds no {' or '.join(DIRECTORY_FILES)}")
    if not path.is_file():
        what = "no such file or directory" if not path.exists() else "not a regular file or a directory"
        raise InputError(f"model.init: {path}: {what}")
    return path


def initial_weights(config: Config, info: DataInfo) -> dict[str, np.ndarray] | None:
    """The neutral float64 weights `[model] init` names for the model of `config` on data `info`
    (None without init); InputError naming the file and the first problem."""
    spec = config.model
    if spec.init is None:
        return None
    from conformance.port.read.weights import import_weights  # the reader `twinstep port weights` uses

    path = weights_file(spec.init)
    sized = spec.model_copy(update={k: v for k, v in model_dims(spec, info)._asdict().items() if v is not None})
    check_hf_config(path.parent / "config.json", sized)
    try:
        return import_weights(path, sized, dtype="float64")  # float64 holds any float exactly
    except TwinstepError as exc:
        raise InputError(f"model.init: {path}: {exc}") from None


def check_hf_config(path: Path, sized: ModelSpec) -> None:
    """A Hugging Face GPT-2 config.json beside the weights against the sized [model] (see the
    module docstring); nothing when there is none or it describes another model type."""
    if not path.is_file():
        return
    try:
        hf = json.loads(read_regular(path, 1 << 20, what="config.json", error=InputError))
    except ValueError as exc:
        raise InputError(f"model.init: {path} is not JSON ({exc})") from None
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        return
    for ours, theirs in HF_SIZES.items():
        want, have = hf.get(theirs), getattr(sized, ours, None)
        if want is not None and have is not None and want != have:
            raise InputError(f"model.init: {path} has {theirs} = {want}, but model.{ours} = {have}; set "
                             f"model.{ours} = {want}")
    act = hf.get("activation_function", "gelu_new")
    if act != "gelu":
        warnings.warn(f"model.init: {path} has activation_function = {act!r}; the built-in gpt uses exact GELU (as "
                      f"nanoGPT does), so its outputs differ slightly from transformers' for these weights",
                      TwinstepWarning, stacklevel=3)
