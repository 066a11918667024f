"""The rest of a torch training loop, as `from_torch(..., scaler=, clip=, accumulation=)` reads it.

    scaler = torch.amp.GradScaler("cuda", init_scale=2**16)       # -> [precision] dynamic loss scaling
    clip = {"max_norm": 1.0}                                      # the loop's clip_grad_norm_(params, 1.0)
    clip = {"clip_value": 0.5}                                    # ... or clip_grad_value_(params, 0.5)
    accumulation = 4                                              # loss / 4; backward; step every 4th

A GradScaler becomes `[precision] loss_scale = "dynamic"` with its init_scale, growth_factor,
backoff_factor and growth_interval, and `schedule_on_skip = "advance"`: the loop torch's AMP recipe
writes (`scaler.step(opt); scaler.update(); scheduler.step()`) steps the scheduler on a skipped
update too (P-SCHED). A disabled scaler is `loss_scale = "none"`. A scaler that has already scaled a
step holds a scale and a growth tracker, which are checkpoint state, not a spec: it is refused. The
clip keywords are torch.nn.utils' own (`max_norm`, `norm_type`, `error_if_nonfinite`; `clip_value`),
applied after `scaler.unscale_(opt)` as the recipe does; `accumulation` is the loop's count of
micro-batches per optimizer step, each loss divided by it (`normalize = "micro_batches"`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conformance.errors import ConfigError, UnsupportedError

CLIP_KEYS = ("max_norm", "norm_type", "error_if_nonfinite", "clip_value")


def precision_section(scaler: Any) -> dict[str, Any]:
    """[precision] of a torch.amp.GradScaler."""
    import torch

    if not isinstance(scaler, torch.amp.GradScaler):
        raise UnsupportedError(f"scaler: expected a torch.amp.GradScaler; received {type(scaler).__qualname__}")
    if not scaler.is_enabled():
        return {"loss_scale": "none"}
    init = float(scaler._init_scale)
    if scaler._scale is not None and (float(scaler.get_scale()) != init or int(scaler._get_growth_tracker()) != 0):
        raise UnsupportedError(f"scaler: this GradScaler has stepped (scale {scaler.get_scale()!r}, growth tracker "
                               f"{int(scaler._get_growth_tracker())}): its scale and tracker are checkpoint state a "
                               f"[precision] section cannot hold; translate it before its first step")
    return {"loss_scale": "dynamic", "init_scale": init, "growth_factor": float(scaler.get_growth_factor()),
            "backoff_factor": float(scaler.get_backoff_factor()), "growth_interval": int(scaler.get_growth_interval()),
            "schedule_on_skip": "advance"}


def clip_section(clip: Any) -> dict[str, Any]:
    """[clip] of the loop's clip_grad_norm_ / clip_grad_value_ arguments (torch's eps)."""
    if not isinstance(clip, Mapping) or not clip or set(clip) - set(CLIP_KEYS):
        raise ConfigError(f"clip must name the loop's clipping call's arguments ({', '.join(CLIP_KEYS)}), e.g. "
                          f"{{'max_norm': 1.0}}; received {clip!r}")
    if "max_norm" not in clip and set(clip) & {"norm_type", "error_if_nonfinite"}:
        raise ConfigError(f"clip: norm_type and error_if_nonfinite belong to clip_grad_norm_, which needs max_norm; "
                          f"received {dict(clip)!r}")
    return dict(clip)


def accumulation_section(accumulation: Any) -> dict[str, Any]:
    """[accumulation] of the loop's micro-batches per optimizer step."""
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise ConfigError(f"accumulation must be the loop's micro-batches per optimizer step, an integer >= 1; "
                          f"received {accumulation!r}")
    return {"steps": accumulation, "normalize": "micro_batches"}
