"""LambdaLR schedules written by Hugging Face transformers, read without importing transformers.

`transformers.get_scheduler` / `get_*_schedule_with_warmup` build a torch LambdaLR whose lr_lambda
is a `functools.partial` of a named function of transformers.optimization with its arguments, so
its mathematics can be read from the name and the keywords (transformers 5.x):

    _get_constant_lambda                              constant
    _get_constant_schedule_with_warmup_lr_lambda      sequential: wsd's warm-up from 0 for W updates,
                                                      then constant (factor 1)
    _get_polynomial_decay_schedule_with_warmup_lr_lambda  the same warm-up, then polynomial (power,
                                                      end_factor = lr_end / lr_init) to the end
    _get_linear_schedule_with_warmup_lr_lambda        wsd: warm-up from 0, no stable part, linear
                                                      decay to 0 at num_training_steps (0 after)
    _get_cosine_schedule_with_warmup_lr_lambda        warmup_cosine, convention "torch" (the cosine
                                                      climbs back after its period, as HF's does),
                                                      min_lr_rate as eta_min, num_cycles when the
                                                      half period is a whole number of updates
    _get_cosine_with_hard_restarts_schedule_with_warmup_lr_lambda
                                                      the same warm-up, then cosine_restarts (t_0 = the
                                                      period, t_mult 1, eta_min 0) when the period
                                                      (num_training_steps − W) / num_cycles is whole
                                                      and transformers' float progress puts every
                                                      restart on its update; exact up to
                                                      num_training_steps, after which transformers'
                                                      lr is 0 and the cosine restarts (a warning says
                                                      so unless the run ends there, as from_hf's does)
    _get_inverse_sqrt_schedule_lr_lambda              inverse_sqrt (warm-up from 0, timescale)
    _get_wsd_scheduler_lambda                         wsd (linear warm-up from min_lr_ratio, decay
                                                      linear | cosine | 1-sqrt to min_lr_ratio)

Every other warm-up is HF's t / num_warmup_steps, twinstep's start_factor = 0. Other functions are
refused naming the function.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from conformance.errors import TwinstepWarning, UnsupportedError

MODULE = "transformers.optimization"


def transformers_function(lr_lambda: Any) -> tuple[str, dict[str, Any]] | None:
    """(function name, keywords) when `lr_lambda` is one of transformers' schedule functions, else None."""
    func, keywords = getattr(lr_lambda, "func", lr_lambda), dict(getattr(lr_lambda, "keywords", None) or {})
    if getattr(func, "__module__", None) != MODULE or getattr(lr_lambda, "args", ()):
        return None
    return func.__name__, keywords


def _whole(value: float, what: str) -> int:
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise UnsupportedError(f"{what} = {value!r} is not a whole number of updates >= 1")
    return int(value)


def read_lambda(name: str, kw: dict[str, Any], base: list[float], ends_at_total: bool = False) -> dict[str, Any]:
    """The [schedule] of transformers' function `name` with keywords `kw` over groups whose base lrs
    are `base`; UnsupportedError naming the function where no spec schedule is exactly it.
    `ends_at_total`: the run ends at num_training_steps (from_hf), so what a schedule does after it
    never applies."""
    where = f"LambdaLR({MODULE}.{name})"
    if name == "_get_constant_lambda":
        return {"name": "constant"}
    warmup = int(kw.get("num_warmup_steps", 0))
    if name == "_get_constant_schedule_with_warmup_lr_lambda":
        if warmup == 0:
            return {"name": "constant"}
        return _after_warmup(warmup, {"name": "constant", "factor": 1.0})
    if name == "_get_polynomial_decay_schedule_with_warmup_lr_lambda":
        total, end, init = int(kw["num_training_steps"]), float(kw["lr_end"]), float(kw["lr_init"])
        if total <= warmup:
            raise UnsupportedError(f"{where}: num_training_steps = {total} <= num_warmup_steps = {warmup} leaves no "
                                   f"decay (transformers divides by zero there)")
        # (lr_init − lr_end)·(1 − u/n)^power + lr_end over lr_init: one end factor for every group
        return _after_warmup(warmup, {"name": "polynomial", "total_iters": total - warmup, "power": float(kw["power"]),
                                      "end_factor": end / init})
    if name == "_get_linear_schedule_with_warmup_lr_lambda":
        total = int(kw["num_training_steps"])
        if total <= warmup:
            raise UnsupportedError(f"{where}: num_training_steps = {total} <= num_warmup_steps = {warmup} leaves no "
                                   f"decay (the lr is 0 after the warm-up)")
        return {"name": "wsd", "warmup_steps": warmup, "start_factor": 0.0, "total_steps": total,
                "decay_steps": total - warmup, "decay_type": "linear", "eta_min": 0.0}
    if name == "_get_cosine_schedule_with_warmup_lr_lambda":
        total, cycles, rate = int(kw["num_training_steps"]), float(kw["num_cycles"]), float(kw.get("min_lr_rate", 0))
        half = _whole((max(1, total - warmup)) / (2 * cycles) if cycles > 0 else math.inf,
                      f"{where}: its half period (num_training_steps − num_warmup_steps) / (2·num_cycles)")
        if rate and any(b != base[0] for b in base):
            raise UnsupportedError(f"{where}: min_lr_rate = {rate} of groups with different lrs ({base}) is no one "
                                   f"eta_min; twinstep's eta_min is an lr")
        return {"name": "warmup_cosine", "warmup_steps": warmup, "total_steps": warmup + half, "start_factor": 0.0,
                "eta_min": rate * base[0], "convention": "torch"}
    if name == "_get_cosine_with_hard_restarts_schedule_with_warmup_lr_lambda":
        return _hard_restarts(kw, where, ends_at_total)
    if name == "_get_wsd_scheduler_lambda":
        return _wsd(kw, base, where)
    if name == "_get_inverse_sqrt_schedule_lr_lambda":
        return {"name": "inverse_sqrt", "warmup_steps": warmup, "start_factor": 0.0,
                "timescale": _whole(float(kw["timescale"]), f"{where}: timescale")}
    raise UnsupportedError(f"{where} cannot be translated: twinstep reads transformers' constant, linear, cosine, "
                           f"cosine with hard restarts, polynomial, inverse_sqrt and wsd schedules; write the "
                           f"[schedule] section by hand")


def _after_warmup(warmup: int, then: dict[str, Any]) -> dict[str, Any]:
    """HF's warm-up t / W from 0 (which torch's LinearLR cannot start from) for the first W updates,
    then `then` from its own step 0: a sequential whose first part is wsd's warm-up (its decay never
    comes); relative to each group's lr, as HF's LambdaLR is."""
    if warmup == 0:
        return then
    return {"name": "sequential", "milestones": [warmup], "schedulers": [
        {"name": "wsd", "warmup_steps": warmup, "start_factor": 0.0, "total_steps": warmup + 1, "decay_steps": 1},
        then]}


def _hard_restarts(kw: dict[str, Any], where: str, ends_at_total: bool) -> dict[str, Any]:
    warmup, total, cycles = int(kw.get("num_warmup_steps", 0)), int(kw["num_training_steps"]), kw["num_cycles"]
    span = total - warmup
    if span < 1:
        raise UnsupportedError(f"{where}: num_training_steps = {total} <= num_warmup_steps = {warmup} leaves no "
                               f"cosine (the lr is 0 after the warm-up)")
    period = _whole(span / cycles if cycles > 0 else math.inf,
                    f"{where}: its period (num_training_steps − num_warmup_steps) / num_cycles")
    for k in range(1, round(cycles)):
        # transformers' (num_cycles · progress) % 1 in floats: a product just below a whole number
        # ends the cycle at lr ≈ 0 one update late instead of restarting
        if (float(cycles) * (float(k * period) / float(span))) % 1.0 != 0.0:
            raise UnsupportedError(f"{where}: transformers' floating-point progress does not restart the cosine at "
                                   f"update {warmup + k * period} (its lr there is ≈ 0, not the peak); no spec "
                                   f"schedule has that step")
    if not ends_at_total:
        warnings.warn(f"{where}: the [schedule] is exact for the first num_training_steps = {total} updates; after "
                      f"them transformers' lr is 0 and the [schedule]'s cosine restarts", TwinstepWarning, stacklevel=4)
    return _after_warmup(warmup, {"name": "cosine_restarts", "t_0": period, "t_mult": 1, "eta_min": 0.0})


def _wsd(kw: dict[str, Any], base: list[float], where: str) -> dict[str, Any]:
    # HF's warm-up starts at min_lr_ratio (twinstep's start_factor), its floor is min_lr_ratio·lr
    warmup, stable, decay = int(kw["num_warmup_steps"]), int(kw["num_stable_steps"]), int(kw["num_decay_steps"])
    rate, shape = float(kw["min_lr_ratio"]), kw["decay_type"]
    if kw["warmup_type"] != "linear" and warmup > 0:
        raise UnsupportedError(f"{where}: warmup_type = {kw['warmup_type']!r}; twinstep's warm-ups are linear")
    if shape == "cosine" and float(kw["num_cycles"]) != 0.5:
        raise UnsupportedError(f"{where}: a cosine decay with num_cycles = {kw['num_cycles']} is not wsd's half "
                               f"cosine (num_cycles = 0.5)")
    if decay < 1 or stable < 0:
        raise UnsupportedError(f"{where}: num_decay_steps = {decay}, num_stable_steps = {stable}: wsd needs a decay "
                               f"of at least 1 update and no negative stable part")
    if rate and any(b != base[0] for b in base):
        raise UnsupportedError(f"{where}: min_lr_ratio = {rate} of groups with different lrs ({base}) is no one "
                               f"eta_min; twinstep's eta_min is an lr")
    return {"name": "wsd", "warmup_steps": warmup, "start_factor": rate, "total_steps": warmup + stable + decay,
            "decay_steps": decay, "decay_type": shape, "eta_min": rate * base[0]}
