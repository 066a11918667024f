"""The bundled gpt as a Hugging Face GPT-2 (`GPT2LMHeadModel`): tensor names and config.json.

Every architectural choice of the bundled gpt has a GPT-2 spelling, so no gpt config is refused:

| bundled gpt (docs/models.md) | GPT-2 config / checkpoint |
| --- | --- |
| Linear weights [out, in], y = x @ W.T + b | Conv1D weights [in, out], y = x @ W + b: transposed |
| GELU, exact erf form | `activation_function = "gelu"` (GPT-2's own default is "gelu_new", the tanh form) |
| LayerNorm eps 1e-5 (LN_EPS) | `layer_norm_epsilon` |
| lm_head tied to wte, no bias | `tie_word_embeddings = true` (no `lm_head.weight` written) |
| learned positions, block_size | `wpe`, `n_positions` |
| attention scale 1/sqrt(d_head), causal | `scale_attn_weights = true`, not by layer index, no upcast |
| `bias = false` (no biases, LayerNorm's too) | biases written as exact zeros (x + 0 = x) |
| FFN width 4·n_embd | `n_inner = null` |
| dropout | `embd_pdrop`, `attn_pdrop`, `resid_pdrop` (inactive in eval) |
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.config.model import ModelSpec
from conformance.rules.models import LN_EPS

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
BIASES = ("ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias", "ln_2.bias", "mlp.c_fc.bias", "mlp.c_proj.bias")
ACTIVATION = "gelu"  # transformers' ACT2FN["gelu"]: the exact erf GELU, as torch's nn.GELU()


def refusal(spec: ModelSpec) -> str | None:
    """Why `--to hf` cannot export this model (None: it can)."""
    if spec.name != "gpt":
        return (f"--to hf writes a Hugging Face GPT-2, which only the bundled gpt is; this run's model is "
                f"{spec.name!r} (use --to torch or --to flax)")
    return None


def _widths(weights: dict[str, np.ndarray]) -> tuple[int, int, int]:
    vocab, d = weights["transformer.wte.weight"].shape
    n_layer = len({k.split(".")[2] for k in weights if k.startswith("transformer.h.")})
    return int(vocab), int(d), n_layer


def hf_tensors(spec: ModelSpec, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GPT-2's names and layout for the neutral gpt weights: the four Conv1D weights transposed to
    [in, out], zero biases where `bias = false`, the tied lm_head left out."""
    out: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        out[name] = np.ascontiguousarray(value.T) if name.endswith(CONV1D) else value
    if not spec.bias:
        _, d, n_layer = _widths(weights)
        dtype = weights["transformer.wte.weight"].dtype
        width = {"attn.c_attn.bias": 3 * d, "mlp.c_fc.bias": 4 * d}
        for i in range(n_layer):
            for b in BIASES:
                out[f"transformer.h.{i}.{b}"] = np.zeros(width.get(b, d), dtype)
        out["transformer.ln_f.bias"] = np.zeros(d, dtype)
    return out


def hf_config(spec: ModelSpec, weights: dict[str, np.ndarray], vocabulary: dict[str, Any] | None) -> dict[str, Any]:
    """config.json of a GPT2LMHeadModel computing the bundled gpt's function (see the table above);
    `vocabulary` (vocab.describe) is recorded under `twinstep_vocabulary`."""
    vocab, d, n_layer = _widths(weights)
    dtype = weights["transformer.wte.weight"].dtype.name
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_positions": int(weights["transformer.wpe.weight"].shape[0]),
        "n_embd": d,
        "n_layer": n_layer,
        "n_head": spec.n_head,
        "n_inner": None,
        "activation_function": ACTIVATION,
        "layer_norm_epsilon": LN_EPS,
        "resid_pdrop": spec.dropout,
        "embd_pdrop": spec.dropout,
        "attn_pdrop": spec.dropout,
        "initializer_range": spec.init_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": None,  # a character or byte vocabulary has no special tokens
        "eos_token_id": None,
        "dtype": dtype,
        "twinstep_vocabulary": vocabulary,
    }
