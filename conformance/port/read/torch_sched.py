"""Read a torch.optim.lr_scheduler object into the neutral `[schedule]` section (torch lazily).

The schedule is described from update 0 with every group's *initial* lr (`base_lrs`; a stepped
scheduler has already changed `group["lr"]`), and the scheduler's position (`last_epoch`, the
update its next `optimizer.step()` performs) is returned beside it. SequentialLR becomes
`sequential` (or `warmup_cosine` with convention "torch" for its LinearLR + CosineAnnealingLR
pair); a ChainedScheduler becomes `chained` (its parts must be chainable: factors of the current
lr); CyclicLR becomes `cyclic` (each group's base lr its own lr); ReduceLROnPlateau becomes
`reduce_on_plateau` before it has observed a metric (after, its best metric, counters and reduced
lrs are state that a [schedule] does not hold). LambdaLR is read when its lr_lambda is one of
transformers' schedule functions (conformance/port/read/hf_sched.py); another LambdaLR and
MultiplicativeLR have no closed form twinstep can read, and are sampled into a `tabulated` schedule
(conformance/port/read/torch_lambda.py): a SequentialLR part before a milestone over its own
updates, any other over the `sample_updates` the caller states.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from conformance.errors import UnsupportedError
from conformance.port.read.hf_sched import read_lambda, transformers_function
from conformance.port.read.torch_lambda import sampled

REFUSED = {"SWALR": "twinstep has no stochastic weight averaging schedule"}


class Read(NamedTuple):
    """A scheduler read: the schedule section, each group's lr for [optimizer] (the scheduler's base
    lr; OneCycleLR's max_lr), and the position (the update the next optimizer.step() performs)."""

    schedule: dict[str, Any]
    lrs: list[float]
    position: int


def _class(scheduler: Any) -> str:
    from torch.optim import lr_scheduler

    name = type(scheduler).__name__
    if getattr(lr_scheduler, name, None) is not type(scheduler):
        raise UnsupportedError(f"scheduler class {type(scheduler).__module__}.{type(scheduler).__qualname__} "
                               f"cannot be translated: twinstep reads torch.optim.lr_scheduler's classes")
    if name in REFUSED:
        raise UnsupportedError(f"{name} cannot be translated: {REFUSED[name]}")
    return name


def _transformers(scheduler: Any) -> tuple[str, dict[str, Any]] | None:
    """The transformers schedule function (name, keywords) every group's lr_lambda is, or None."""
    found = [transformers_function(f) for f in scheduler.lr_lambdas]
    return found[0] if found[0] is not None and all(f == found[0] for f in found) else None


def _int(value: Any, what: str) -> int:
    if float(value) != int(value):
        raise UnsupportedError(f"{what} = {value!r} is not a whole number of updates")
    return int(value)


def _same(values: list[float], what: str) -> float:
    if any(v != values[0] for v in values):
        raise UnsupportedError(f"{what} differs between param groups ({values}); twinstep's schedule has one")
    return float(values[0])


def _floors(values: list[float]) -> float | list[float]:
    """ReduceLROnPlateau's min_lrs: one number when every group has the same, else one per group."""
    return values[0] if all(v == values[0] for v in values) else values


def _exact_ratio(num: float, den: float, check: Any) -> float:
    """A float within 4 ulps of num / den for which `check` holds, the shortest written one (torch
    keeps only products such as max_lr / div_factor: the factor the user wrote is recovered)."""
    x = up = down = num / den
    candidates = [x]
    for _ in range(4):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        candidates += [up, down]
    fits = [c for c in candidates if check(c)]
    return min(fits, key=lambda c: len(repr(c))) if fits else x


def _onecycle(s: Any, groups: list[dict[str, Any]]) -> dict[str, Any]:
    total = int(s.total_steps)
    phases = s._schedule_phases
    first = float(phases[0]["end_step"])
    pct = _exact_ratio(first + 1, total, lambda p: float(p * total) - 1 == first)
    g = groups[0]
    div = _exact_ratio(g["max_lr"], g["initial_lr"], lambda d: g["max_lr"] / d == g["initial_lr"])
    final = _exact_ratio(g["initial_lr"], g["min_lr"], lambda f: g["initial_lr"] / f == g["min_lr"])
    for i, other in enumerate(groups[1:], 1):
        if other["max_lr"] / div != other["initial_lr"] or other["initial_lr"] / final != other["min_lr"]:
            raise UnsupportedError(f"OneCycleLR: param group {i} has another div_factor or final_div_factor")
    out = {"name": "onecycle", "total_steps": total, "pct_start": pct, "anneal_strategy": s._anneal_func_type,
           "div_factor": div, "final_div_factor": final, "three_phase": len(phases) == 3,
           "cycle_momentum": bool(s.cycle_momentum)}
    if s.cycle_momentum:
        out["base_momentum"] = _same([gr["base_momentum"] for gr in groups], "OneCycleLR base_momentum")
        out["max_momentum"] = _same([gr["max_momentum"] for gr in groups], "OneCycleLR max_momentum")
    return out


def _cyclic(s: Any, groups: list[dict[str, Any]]) -> dict[str, Any]:
    if s._scale_fn_custom is not None:
        raise UnsupportedError("CyclicLR with a custom scale_fn cannot be translated: its mathematics is an "
                               "arbitrary Python function; use mode triangular, triangular2 or exp_range")
    total, ratio = float(s.total_size), float(s.step_ratio)
    up = round(total * ratio)
    if float(up) / total != ratio or up < 1 or total - up < 1 or float(total) != int(total):
        raise UnsupportedError(f"CyclicLR step sizes (total {total!r}, ratio {ratio!r}) are not whole numbers of "
                               f"updates")
    out = {"name": "cyclic", "max_lr": _same([float(m) for m in s.max_lrs], "CyclicLR max_lr"),
           "step_size_up": up, "step_size_down": int(total) - up, "mode": s.mode, "gamma": float(s.gamma),
           "cycle_momentum": bool(s.cycle_momentum)}
    if s.cycle_momentum:
        out["base_momentum"] = _same([float(m) for m in s.base_momentums], "CyclicLR base_momentum")
        out["max_momentum"] = _same([float(m) for m in s.max_momentums], "CyclicLR max_momentum")
    if s.mode != "exp_range":
        del out["gamma"]  # torch reads it only for exp_range
    return out


def _plateau(s: Any) -> dict[str, Any]:
    if s.last_epoch > 0:
        raise UnsupportedError(f"ReduceLROnPlateau has observed {s.last_epoch} metrics: its best value, counters "
                               f"and reduced lrs are state a [schedule] cannot hold; translate it before its "
                               f"first step")
    return {"name": "reduce_on_plateau", "mode": s.mode, "factor": float(s.factor), "patience": int(s.patience),
            "threshold": float(s.threshold), "threshold_mode": s.threshold_mode, "cooldown": int(s.cooldown),
            "min_lr": _floors([float(m) for m in s.min_lrs]), "eps": float(s.eps)}


def _milestones(s: Any) -> list[int]:
    counts = s.milestones
    repeated = [m for m, n in counts.items() if n > 1]
    if repeated:
        raise UnsupportedError(f"MultiStepLR milestone {repeated[0]} is listed more than once (gamma applied "
                               f"twice there); twinstep's milestones are distinct")
    return sorted(int(m) for m in counts)


def _single(s: Any, name: str, groups: list[dict[str, Any]], sample: int | None = None, ends: bool = False,
            start: int = 0) -> dict[str, Any]:
    """One non-composite scheduler as a schedule table (a lambda sampled for `sample` updates)."""
    hf = _transformers(s) if name == "LambdaLR" else None
    if hf is not None:
        return read_lambda(*hf, [float(g["initial_lr"]) for g in groups])
    if name in ("LambdaLR", "MultiplicativeLR"):
        return sampled(s, name, sample, ends=ends, start=start)
    if name == "ConstantLR":
        return {"name": "constant", "factor": float(s.factor), "total_iters": int(s.total_iters)}
    if name == "StepLR":
        return {"name": "step", "step_size": int(s.step_size), "gamma": float(s.gamma)}
    if name == "MultiStepLR":
        return {"name": "multistep", "milestones": _milestones(s), "gamma": float(s.gamma)}
    if name == "ExponentialLR":
        return {"name": "exponential", "gamma": float(s.gamma)}
    if name == "CosineAnnealingLR":
        return {"name": "cosine", "t_max": _int(s.T_max, "CosineAnnealingLR T_max"), "eta_min": float(s.eta_min)}
    if name == "LinearLR":
        return {"name": "linear", "start_factor": float(s.start_factor), "end_factor": float(s.end_factor),
                "total_iters": int(s.total_iters)}
    if name == "PolynomialLR":
        return {"name": "polynomial", "total_iters": int(s.total_iters), "power": float(s.power)}
    if name == "CosineAnnealingWarmRestarts":
        return {"name": "cosine_restarts", "t_0": int(s.T_0), "t_mult": int(s.T_mult), "eta_min": float(s.eta_min)}
    if name == "OneCycleLR":
        return _onecycle(s, groups)
    if name == "CyclicLR":
        return _cyclic(s, groups)
    if name == "ReduceLROnPlateau":
        return _plateau(s)
    raise UnsupportedError(f"{name} cannot be translated: twinstep has no such schedule")


def _warmup_cosine(parts: list[dict[str, Any]], milestones: list[int]) -> dict[str, Any] | None:
    """SequentialLR([LinearLR(sf, 1, W), CosineAnnealingLR(T - W, eta)], [W]) is warmup_cosine."""
    if len(parts) != 2 or [p["name"] for p in parts] != ["linear", "cosine"]:
        return None
    warm, cos = parts
    w = milestones[0]
    if warm["end_factor"] != 1.0 or warm["total_iters"] != w:
        return None
    return {"name": "warmup_cosine", "warmup_steps": w, "total_steps": w + cos["t_max"],
            "start_factor": warm["start_factor"], "eta_min": cos["eta_min"], "convention": "torch"}


def _sequential(s: Any, groups: list[dict[str, Any]], base: list[float], sample: int | None) -> dict[str, Any]:
    parts = []
    milestones = [int(m) for m in s._milestones]
    for i, child in enumerate(s._schedulers):
        name = _class(child)
        if name in ("SequentialLR", "ChainedScheduler", "OneCycleLR", "CyclicLR", "ReduceLROnPlateau"):
            raise UnsupportedError(f"SequentialLR part {i} is a {name}; twinstep's sequential parts cannot be "
                                   f"sequential, chained, onecycle, cyclic or reduce_on_plateau (torch cannot "
                                   f"restart them at a milestone)")
        if [float(b) for b in child.base_lrs] != base:
            raise UnsupportedError(f"SequentialLR part {i} starts from other base lrs {child.base_lrs} than {base}")
        start, ends = ([0, *milestones][i], i < len(milestones))
        length = milestones[i] - start if ends else None if sample is None else sample - start
        if length is not None and length < 1:
            raise UnsupportedError(f"sample_updates = {sample} ends before SequentialLR part {i} starts at update "
                                   f"{start}: state the updates of the whole run")
        parts.append(_single(child, name, groups, length, ends, start))
    return _warmup_cosine(parts, milestones) or {"name": "sequential", "milestones": milestones,
                                                  "schedulers": parts}


def _base_lrs(scheduler: Any, name: str, groups: list[dict[str, Any]]) -> list[float]:
    if name == "OneCycleLR":
        return [float(g["max_lr"]) for g in groups]  # each group peaks at its own lr
    if name == "SequentialLR":
        return [float(g["initial_lr"]) for g in groups]
    if name == "ChainedScheduler":
        return [float(b) for b in scheduler._schedulers[0].base_lrs]
    if name == "ReduceLROnPlateau":
        return [float(g["lr"]) for g in groups]  # it keeps no base lrs; before its first step, the groups' lr
    return [float(b) for b in scheduler.base_lrs]  # CyclicLR: base_lr per group


CHAINABLE = ("ConstantLR", "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR", "PolynomialLR")


def _chained(scheduler: Any, optimizer: Any, sample_updates: int | None) -> Read:
    """ChainedScheduler: every part a factor of the current lr (conformance/config/schedule_checks.py)."""
    parts = list(scheduler._schedulers)
    if len(parts) == 1:  # one part: that scheduler itself
        inner = read_scheduler(parts[0], optimizer, sample_updates)
        return Read(inner.schedule, inner.lrs, int(parts[0].last_epoch))
    groups, base = optimizer.param_groups, [float(b) for b in parts[0].base_lrs]
    tables, positions = [], set()
    for i, part in enumerate(parts):
        name = _class(part)
        if name not in CHAINABLE:
            raise UnsupportedError(f"ChainedScheduler part {i} is a {name}, which sets the lr rather than "
                                   f"multiplying it; twinstep's chained parts are {', '.join(CHAINABLE)}")
        if name == "CosineAnnealingLR" and part.eta_min != 0:
            raise UnsupportedError(f"ChainedScheduler part {i}: CosineAnnealingLR(eta_min = {part.eta_min!r}) "
                                   f"anneals lr − eta_min, which does not multiply; chained needs eta_min = 0")
        tables.append(_single(part, name, groups))
        positions.add(_int(part.last_epoch, f"ChainedScheduler part {i} last_epoch"))
    if len(positions) != 1:
        raise UnsupportedError(f"ChainedScheduler parts were stepped different numbers of times ({sorted(positions)})")
    return Read({"name": "chained", "schedulers": tables}, base, positions.pop())


def read_scheduler(scheduler: Any, optimizer: Any, sample_updates: int | None = None) -> Read:
    """Translate `scheduler` (built on `optimizer`), see the module docstring; `sample_updates`: the
    updates of the run, over which an arbitrary lr_lambda is sampled."""
    name = _class(scheduler)
    if getattr(scheduler, "optimizer", None) is not optimizer:
        raise UnsupportedError(f"the {name} was built on another optimizer than the one given")
    groups = optimizer.param_groups
    if name == "ChainedScheduler":
        return _chained(scheduler, optimizer, sample_updates)
    base = _base_lrs(scheduler, name, groups)
    if name == "SequentialLR":
        schedule = _sequential(scheduler, groups, base, sample_updates)
    else:
        schedule = _single(scheduler, name, groups, sample_updates)
    position = 0 if name == "ReduceLROnPlateau" else _int(scheduler.last_epoch, f"{name}.last_epoch")
    if sample_updates is not None and position >= sample_updates and _tabulated(schedule):
        raise UnsupportedError(f"sample_updates = {sample_updates} does not reach the scheduler's position, update "
                               f"{position}: the table counts from update 0, so state the updates of the whole run")
    return Read(schedule, base, position)


def _tabulated(schedule: dict[str, Any]) -> bool:
    return schedule["name"] == "tabulated" or any(p["name"] == "tabulated" for p in schedule.get("schedulers", []))
