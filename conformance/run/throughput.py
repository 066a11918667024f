"""Throughput extras of an update line: tokens/s for text, MFU for gpt against PEAK_FLOPS.
"""

from __future__ import annotations

from typing import Any

from conformance.config import Config
from conformance.data import Window
from conformance.rules.models import flops_per_token
from conformance.run.session import Run

# Dense bf16 peak FLOP/s per device (torchtitan's table, reference/trainer_anchors.md §2); MFU is
# reported against these whatever the compute dtype, and only where the device is known.
PEAK_FLOPS: dict[str, float] = {
    "H200": 989e12, "H100 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12,
    "L40S": 362e12, "A10G": 70e12, "L4": 121e12, "MI300X": 1300e12, "MI325X": 1300e12,
}


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device from its name (the longest matching key), or None."""
    hits = [k for k in PEAK_FLOPS if k.lower() in device_name.lower()]
    return PEAK_FLOPS[max(hits, key=len)] if hits else None


def throughput_extras(config: Config, run: Run, window: Window, elapsed_s: float,
                      device_name: str | None = None) -> dict[str, Any]:
    """Extra keys of an update line: tokens_per_s for language data (text, tokens, token targets
    passed to train()), mfu (fraction of the device's peak) when the FLOPs per token are known (gpt)
    or given (`[model] flops_per_token` of a user's model) and `device_name` has a known peak
    (trainers pass it on accelerators only)."""
    if run.data.info.task != "language_model" or elapsed_s <= 0:
        return {}
    block = run.data.info.block_size or config.model.block_size
    tokens_per_s = window.global_samples * block / elapsed_s
    out: dict[str, Any] = {"tokens_per_s": tokens_per_s}
    peak = peak_flops(device_name) if device_name else None
    flops = flops_per_token(config.model, run.data.info, block) if config.model.name == "gpt" else \
        config.model.flops_per_token
    if peak is not None and flops is not None:
        per_device = tokens_per_s / max(run.world_size, 1)
        out["mfu"] = flops * per_device / peak
    return out
