"""The built-in models' parameter names outside twinstep (docs/export.md).

torch: `model.state_dict()` of ref_torch's module holds the neutral names and also the tied
`lm_head.weight` of gpt (a state_dict lists a shared tensor under every name), so a strict
`load_state_dict` needs both. Flax: ref_jax's NNX modules keep torch's [out, in] layout, and their
parameter tree is the neutral name split at the dots ('/'-joined here), under `layers/` for the
mlp, whose layers are an `nnx.List` called `layers`.
"""

from __future__ import annotations

import numpy as np

from conformance.config.model import ModelSpec

TIED_HEAD = "lm_head.weight"  # the gpt's output head: the same tensor as transformer.wte.weight


def torch_state_dict(spec: ModelSpec, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{state_dict key: array} that `load_state_dict` of ref_torch's module accepts strictly."""
    out = dict(weights)
    if spec.name == "gpt":
        out[TIED_HEAD] = weights["transformer.wte.weight"]  # a copy on disk; tied again on load
    return out


def flax_path(spec: ModelSpec, name: str) -> str:
    """The '/'-joined path of a neutral parameter in ref_jax's NNX parameter tree."""
    path = name.replace(".", "/")
    return f"layers/{path}" if spec.name == "mlp" else path


def flax_params(spec: ModelSpec, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{'/'-joined NNX path: array} for ref_jax's module of `spec`."""
    return {flax_path(spec, k): v for k, v in weights.items()}
