"""Import foreign weights for the built-in models into the neutral format (docs/porting.md, "Weights").

    tensors = import_weights("ckpt.pt", ModelSpec(name="gpt", ...))     # {neutral name: ndarray}
    save_tensors("model.safetensors", tensors)                            # what import_weights(model, path) loads

Sources: a PyTorch state_dict (safetensors, or a .pt/.pth/.bin read with torch.load(...,
weights_only=True), never plain pickle; nanoGPT's {"model": ...} checkpoints too), or a Flax
parameter tree (msgpack via flax.serialization.msgpack_restore, or a nested dict of arrays).
Formats: "torch" (twinstep's and nanoGPT's names and [out, in] layout; DDP's `module.` and
torch.compile's `_orig_mod.` prefixes stripped), "hf" (Hugging Face GPT-2: Conv1D weights [in, out],
transposed), "flax" (linen: Dense `kernel` [in, out] transposed, LayerNorm `scale` and Embed
`embedding` renamed `weight`, Sequential `layers_i` or `Dense_i`/`LayerNorm_i` numbering). Every
expected tensor must be present with its exact shape; an unknown name is refused, naming it; values
are cast to `dtype` only where the cast is exact.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from conformance.config.model import ModelSpec
from conformance.errors import InputError
from conformance.rules.models import (
    ModelDims,
    dims_from_params,
    mlp_layers,
    param_shapes,
)

FORMATS = ("auto", "torch", "hf", "flax")
WRAPPERS = ("module.", "_orig_mod.")  # DDP and torch.compile prefixes
BUFFERS = re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$")  # nanoGPT / HF causal-mask buffers
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
MAX_BYTES = 64 << 30


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _numpy(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, possibly bfloat16
        import ml_dtypes
        import torch

        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
        value = t.numpy()
    arr = np.asarray(value)
    if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
        raise InputError(f"weight {name!r} has dtype {arr.dtype}; expected floating-point values")
    return arr


def read_source(source: Any) -> tuple[dict[str, np.ndarray], str | None]:
    """(flat {name: array}, the format the file itself implies or None) from a path or a mapping."""
    if isinstance(source, Mapping):
        nested = any(isinstance(v, Mapping) for v in source.values())
        return {k: _numpy(v, k) for k, v in _flatten(source).items()}, ("flax" if nested else None)
    path = Path(source)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if size > MAX_BYTES:
        raise InputError(f"{path}: {size} bytes is larger than any built-in model's weights")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from conformance.checkpoint.files import decode_tensors

        return dict(decode_tensors(path.read_bytes(), path)), None
    if suffix in (".pt", ".pth", ".bin"):
        return _torch_file(path), None
    if suffix == ".msgpack":
        from flax.serialization import msgpack_restore

        try:
            tree = msgpack_restore(path.read_bytes())
        except Exception as exc:  # msgpack raises its own types on damaged input
            raise InputError(f"{path}: not a Flax msgpack file ({type(exc).__name__})") from None
        return {k: _numpy(v, k) for k, v in _flatten(tree).items()}, "flax"
    raise InputError(f"{path}: unknown weight file type {suffix!r}; expected .safetensors, .pt/.pth/.bin "
                     f"(a torch state_dict) or .msgpack (Flax)")


def _torch_file(path: Path) -> dict[str, np.ndarray]:
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)  # never plain pickle
    except Exception as exc:  # UnpicklingError for anything beyond tensors and plain containers
        raise InputError(f"{path}: not a torch state_dict that loads with weights_only=True "
                         f"({type(exc).__name__})") from None
    if isinstance(data, Mapping):
        for key in ("model", "state_dict", "model_state_dict"):  # nanoGPT, Lightning-style checkpoints
            if key in data and isinstance(data[key], Mapping):
                data = data[key]
                break
    if not isinstance(data, Mapping) or not all(hasattr(v, "detach") for v in data.values()):
        raise InputError(f"{path}: expected a state_dict (parameter name -> tensor) or a checkpoint holding "
                         f"one under 'model' or 'state_dict'")
    return {str(k): _numpy(v, str(k)) for k, v in data.items()}


def _strip(names: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in names.items():
        for prefix in WRAPPERS:
            k = k[len(prefix):] if k.startswith(prefix) else k
        out[k] = v
    return out


def detect(spec: ModelSpec, tensors: dict[str, np.ndarray], hint: str | None) -> str:
    """The format of a flat tensor dict: Flax leaf names, HF GPT-2's [in, out] c_attn, else torch."""
    if hint == "flax" or any(k.rsplit(".", 1)[-1] in ("kernel", "scale", "embedding") for k in tensors):
        return "flax"
    if spec.name == "gpt":
        attn = next((v for k, v in tensors.items() if k.endswith("h.0.attn.c_attn.weight")), None)
        if attn is not None and attn.ndim == 2 and attn.shape[1] == 3 * attn.shape[0]:
            return "hf"
    return "torch"


def _gpt(tensors: dict[str, np.ndarray], transpose: bool) -> dict[str, np.ndarray]:
    """nanoGPT / HF GPT-2 names to neutral: `transformer.` prefix, lm_head tied, buffers dropped."""
    out = {}
    for k, v in tensors.items():
        k = k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}"
        if BUFFERS.search(k):
            continue  # the causal mask, not a parameter
        if transpose and k.endswith(CONV1D):
            v = v.T  # Conv1D stores [in, out]
        out[k] = v
    head = out.pop("lm_head.weight", None)
    wte = out.get("transformer.wte.weight")
    if head is not None and (wte is None or head.shape != wte.shape or not np.array_equal(head, wte)):
        raise InputError("weight 'lm_head.weight' differs from 'transformer.wte.weight'; the built-in gpt ties "
                         "its output head to the token embedding")
    return out


def _flax_leaf(path: str, value: np.ndarray) -> tuple[str, np.ndarray]:
    head, _, leaf = path.rpartition(".")
    weight = f"{head}.weight" if head else "weight"
    if leaf == "kernel":
        return weight, value.T if value.ndim == 2 else value  # Dense kernel [in, out]
    if leaf in ("scale", "embedding"):
        return weight, value
    return path, value


def _flax(spec: ModelSpec, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    flat = {k[len("params."):] if k.startswith("params.") else k: v for k, v in tensors.items()}
    renamed = dict(_flax_leaf(k, v) for k, v in flat.items())
    if spec.name == "linear":
        return {k[len("Dense_0."):] if k.startswith("Dense_0.") else k: v for k, v in renamed.items()}
    if spec.name == "gpt":
        return {re.sub(r"(^|\.)h_(\d+)\.", r"\1h.\2.", k if k.startswith("transformer.") else f"transformer.{k}"): v
                for k, v in renamed.items()}
    kinds = [kind for kind, _, _ in mlp_layers(spec, ModelDims(1, 1, None, None))]  # kinds need no widths
    index = {"Dense": [i for i, k in enumerate(kinds) if k == "linear"],
             "LayerNorm": [i for i, k in enumerate(kinds) if k == "norm"]}
    out = {}
    for k, v in renamed.items():
        m = re.match(r"^(?:layers_(\d+)|(Dense|LayerNorm)_(\d+))\.(.+)$", k)
        if m and m.group(1) is not None:
            k = f"{m.group(1)}.{m.group(4)}"
        elif m and int(m.group(3)) < len(index[m.group(2)]):
            k = f"{index[m.group(2)][int(m.group(3))]}.{m.group(4)}"
        out[k] = v
    return out


def _zero_biases_dropped(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A GPT-2 directory always holds biases: for a model with bias = false they must be zero
    (as `twinstep export --to hf` writes them) and are dropped; a non-zero one is refused."""
    out = {}
    for k, v in tensors.items():
        if k.endswith(".bias"):
            if np.any(np.asarray(v, np.float64) != 0):
                raise InputError(f"weight {k!r} is a non-zero bias, but model.bias = false; set model.bias = true "
                                 f"to keep it")
            continue
        out[k] = v
    return out


def to_neutral(spec: ModelSpec, tensors: dict[str, np.ndarray], fmt: str) -> dict[str, np.ndarray]:
    """Rename and re-lay a flat tensor dict of format `fmt` into neutral names (unchecked)."""
    tensors = _strip(tensors)
    if fmt == "flax":
        tensors = _flax(spec, tensors)
    if spec.name == "gpt":
        out = _gpt(tensors, transpose=fmt == "hf")
        return _zero_biases_dropped(out) if fmt == "hf" and not spec.bias else out
    if fmt == "hf":
        raise InputError(f"format 'hf' (GPT-2 Conv1D layout) is for model.name = 'gpt'; received {spec.name!r}")
    return tensors


def _expected(spec: ModelSpec, tensors: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    dims = dims_from_params(spec, shapes)
    for field, value in dims.items():
        want = getattr(spec, field)
        if field in ("in_features", "out_features", "vocab_size", "block_size") and want is not None and want != value:
            raise InputError(f"model.{field} = {want} but the weights have {value}")
    return param_shapes(spec.model_copy(update=dims), None)


def _cast(name: str, value: np.ndarray, dtype: str) -> np.ndarray:
    import ml_dtypes

    target = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    out = value.astype(target)
    if not np.array_equal(out.astype(np.float64), value.astype(np.float64), equal_nan=True):
        raise InputError(f"weight {name!r} ({value.dtype}) does not convert to {dtype} exactly; import it as "
                         f"{value.dtype} (dtype = {value.dtype.name!r}) or convert it yourself")
    return out


def check(spec: ModelSpec, tensors: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Every expected tensor present with its shape, nothing else; values cast exactly to `dtype`.
    Returns the tensors in the model's parameter order."""
    expected = _expected(spec, tensors)
    extra = [k for k in tensors if k not in expected]
    if extra:
        shown = ", ".join(repr(k) for k in extra[:4]) + (f" (+{len(extra) - 4} more)" if len(extra) > 4 else "")
        raise InputError(f"weights {shown} are not parameters of the built-in {spec.name} (its names: "
                         f"{', '.join(list(expected)[:3])}, ...; docs/porting.md)")
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise InputError(f"weight {missing[0]!r} is missing ({len(missing)} missing in all)")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise InputError(f"weight {name!r} has shape {tuple(tensors[name].shape)}; the model needs {shape}")
    return {name: _cast(name, np.asarray(tensors[name]), dtype) for name in expected}


def import_weights(source: Any, spec: ModelSpec, fmt: str = "auto", dtype: str = "float32") -> dict[str, np.ndarray]:
    """Neutral {name: array} weights for the built-in model `spec` from `source` (see the module
    docstring); InputError names the first problem (file, tensor, shape, dtype, unknown name)."""
    if fmt not in FORMATS:
        raise InputError(f"format must be one of {', '.join(FORMATS)}; received {fmt!r}")
    tensors, hint = read_source(source)
    if not tensors:
        raise InputError("the weights hold no tensor")
    chosen = detect(spec, _strip(tensors), hint) if fmt == "auto" else fmt
    return check(spec, to_neutral(spec, tensors, chosen), dtype)
