"""`[ema]`: an exponential moving average of the weights, kept beside them, checkpointed, exportable.

    [ema]
    decay = 0.999        # ema ← decay·ema + (1 − decay)·p (absent: no EMA)
    every = 1            # after every 1st update ...
    start = 0            # ... from update 0 on: the first EMA update copies the weights
    evaluate = true      # evaluations (val_loss) use the EMA weights

After an applied update t (0-based; a skipped update changes neither the weights nor the EMA)
with t ≥ start and (t − start) divisible by `every`, the EMA is updated: the first time it is set
to the weights, then ema ← decay·ema + (1 − decay)·p, computed as torch's lerp(ema, p, 1 − decay).
It is kept in float32 (float64 for float64 weights), whatever the weights' dtype. How the peers
map (docs/divergences.md E-EMA): Keras `use_ema=True, ema_momentum=decay` is every = 1, start =
0 (`ema_overwrite_frequency`, which writes the EMA back into the weights, has no equivalent);
torch `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))` with
`update_parameters(model)` after each due `optimizer.step()` is exactly this rule; optax's
`ema(decay, debias=True)` over the weights is another rule (debiased from zero), and
`optax.incremental_update(params, ema, 1 − decay)` after a first copy is this one.
"""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from conformance.config.base import NonNegInt, PosInt, Section, UnitClosed, field_error


class EmaSpec(Section):
    """No `decay`: no EMA (the other fields must keep their defaults then)."""

    decay: UnitClosed | None = None
    every: PosInt = 1
    start: NonNegInt = 0
    evaluate: bool = False

    @model_validator(mode="after")
    def _check(self) -> "EmaSpec":
        if self.decay is None:
            for key, default in (("evaluate", False), ("every", 1), ("start", 0)):
                value: Any = getattr(self, key)
                if value != default:
                    raise field_error(key, f"needs ema.decay (no EMA is kept without it); received {key} = "
                                           f"{value!r} and no decay")
        return self

    @property
    def enabled(self) -> bool:
        return self.decay is not None
