"""The built-in NNX models' plumbing shared by ref_jax.models, ref_jax.checkpoint and ref_jax._model:
where each parameter lives in the module tree, and autocast switched on or off in place."""

from __future__ import annotations

from typing import Any

from flax import nnx


def set_autocast(model: nnx.Module, dtype: Any) -> None:
    """Run the model as torch.autocast(dtype) runs its twin (dtype bfloat16 or float16; None: off):
    parameters stay in their dtype; every linear map (and the lm_head) computes in `dtype` with
    float32 accumulation; activations, LayerNorm and attention take half inputs in float32 and
    round once; embeddings and the residual stream keep the parameters' dtype."""
    for _, module in nnx.iter_modules(model):
        if hasattr(module, "autocast"):
            module.autocast = dtype


def param_paths(model: nnx.Module) -> dict[str, tuple[Any, ...]]:
    """Every parameter's nnx state path by neutral name, in model.param_names' order: the path
    joined with "." (a model's `unnamed_container`, e.g. the mlp's nnx.List `layers`, is not part of
    its names, as torch's nn.Sequential has no name for its layers)."""
    unnamed = getattr(model, "unnamed_container", None)
    found = {}
    for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        parts = [str(p) for p in path]
        found[".".join(parts[1:] if parts[0] == unnamed else parts)] = tuple(path)
    return {name: found[name] for name in model.param_names}
