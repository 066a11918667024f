"""Porting between native set-ups and twinstep's neutral spec (docs/porting.md).

    from conformance.port import from_hf, from_torch, from_optax, to_code
    spec = from_torch(optimizer, scheduler, model.named_parameters())   # torch objects -> spec
    spec = from_optax({"optax": {"chain": [...]}})                      # optax description -> spec
    print(to_code(load_config(spec), "torch"))                          # spec -> plain torch / optax code

Layout: `read/` (native set-ups and foreign weights into the spec), `write/` (the spec as plain torch /
optax code), `verify/` (traces of backends, snippets and native objects, compared update by update).
Weights: `conformance.port.read.weights.import_weights`. Nothing here imports torch or jax at import
time; the functions that read torch objects or run code import them when called.
"""

from __future__ import annotations

from typing import Any

from conformance.errors import ConfigError
from conformance.port.read.from_hf import from_hf
from conformance.port.read.from_optax import from_optax
from conformance.port.read.from_torch import Ported, from_torch

__all__ = ["Ported", "from_hf", "from_optax", "from_torch", "to_code"]


def to_code(config: Any, framework: str, source: str = "", updates_per_epoch: int = 1) -> str:
    """A runnable snippet (no twinstep import) reproducing `config` (a Config): framework "torch"
    (torch.optim + lr_scheduler + an Updater) or "optax" (an optax chain and a step function)."""
    from conformance.port.write.optax_code import optax_code
    from conformance.port.write.torch_code import torch_code

    makers = {"torch": torch_code, "optax": optax_code}
    if framework not in makers:
        raise ConfigError(f"framework must be 'torch' or 'optax'; received {framework!r}")
    return makers[framework](config, source, updates_per_epoch)
