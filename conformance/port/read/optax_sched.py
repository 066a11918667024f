"""optax schedules (by their function names and arguments) as a neutral `[schedule]` and base lr.

A description is a number or a one-key table `{function_name = {argument = value, ...}}`. It is
read into pieces (length or open-ended, the value it starts from, and `fit(b)`: the spec part that
gives the same values for a group whose base lr is b), joined at join_schedules' boundaries the
way SequentialLR restarts its parts. The base lr is the one value a torch-style piece (cosine,
exponential, polynomial, onecycle, ...) must start from (its `anchor`), else the largest value;
linear and constant pieces are factors of it, above 1 where optax starts or holds above it
(`start_factor` > 1: a warm-up from above the peak). optax's end values are `end_factor`. The mathematics is kept exactly; optax's own float32 rounding
of int32 counts (reference/semantics.md §0.2) is not part of it: the spec computes in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from conformance.errors import ConfigError, UnsupportedError

REQUIRED = object()

# optax 0.2.8 schedule functions: argument -> default (tests/test_port_optax.py checks the signatures)
SCHEDULES: dict[str, dict[str, Any]] = {
    "constant_schedule": {"value": REQUIRED},
    "exponential_decay": {"init_value": REQUIRED, "transition_steps": REQUIRED, "decay_rate": REQUIRED,
                          "transition_begin": 0, "staircase": False, "end_value": None},
    "cosine_decay_schedule": {"init_value": REQUIRED, "decay_steps": REQUIRED, "alpha": 0.0, "exponent": 1.0},
    "warmup_cosine_decay_schedule": {"init_value": REQUIRED, "peak_value": REQUIRED, "warmup_steps": REQUIRED,
                                     "decay_steps": REQUIRED, "end_value": 0.0, "exponent": 1.0},
    "linear_schedule": {"init_value": REQUIRED, "end_value": REQUIRED, "transition_steps": REQUIRED,
                        "transition_begin": 0},
    "polynomial_schedule": {"init_value": REQUIRED, "end_value": REQUIRED, "power": REQUIRED,
                            "transition_steps": REQUIRED, "transition_begin": 0},
    "piecewise_constant_schedule": {"init_value": REQUIRED, "boundaries_and_scales": None},
    "join_schedules": {"schedules": REQUIRED, "boundaries": REQUIRED},
    "cosine_onecycle_schedule": {"transition_steps": REQUIRED, "peak_value": REQUIRED, "pct_start": 0.3,
                                 "div_factor": 25.0, "final_div_factor": 1e4},
    "linear_onecycle_schedule": {"transition_steps": REQUIRED, "peak_value": REQUIRED, "pct_start": 0.3,
                                 "pct_final": 0.85, "div_factor": 25.0, "final_div_factor": 1e4},
    "sgdr_schedule": {"cosine_kwargs": REQUIRED},
    "warmup_constant_schedule": {"init_value": REQUIRED, "peak_value": REQUIRED, "warmup_steps": REQUIRED},
    "warmup_exponential_decay_schedule": {"init_value": REQUIRED, "peak_value": REQUIRED, "warmup_steps": REQUIRED,
                                          "transition_steps": REQUIRED, "decay_rate": REQUIRED,
                                          "transition_begin": 0, "staircase": False, "end_value": None},
}
REFUSED = {"piecewise_interpolate_schedule": "its interpolation between arbitrary points has no spec schedule"}

Fit = Callable[[float], dict[str, Any]]


class Piece(NamedTuple):
    length: int | None  # updates this piece runs before the next starts (None: for ever)
    peak: float  # the largest value it takes: the natural base lr
    fit: Fit  # the spec part for a group with base lr b
    kind: tuple[Any, ...] = ()  # what it is, for recognising warmup + cosine
    anchor: float | None = None  # the base lr a torch-style part must start from (None: any)


def arguments(name: str, args: Any, where: str, table: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """`args` checked against optax's signature of `name`, defaults filled in."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where} must be a table of {name}'s arguments; received {args!r}")
    known = table[name]
    for key in args:
        if key not in known:
            raise ConfigError(f"{where}.{key} is not an argument of optax.{name} (arguments: {', '.join(known)})")
    missing = [k for k, v in known.items() if v is REQUIRED and k not in args]
    if missing:
        raise ConfigError(f"{where}.{missing[0]} is required (optax.{name} has no default for it)")
    return {**known, **args}


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number; received {value!r}")
    return float(value)


def _steps(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnsupportedError(f"{where} must be an integer >= 1 for twinstep; received {value!r}")
    return value


def _relative(v: float, b: float, where: str) -> float:
    if b <= 0 or v < 0:
        raise UnsupportedError(f"{where}: the value {v!r} is not a factor >= 0 of the base lr {b!r}; twinstep's "
                               f"schedules are factors of a positive base lr")
    return v / b


def _equal(v: float, b: float, what: str) -> None:
    if v != b:
        raise UnsupportedError(f"{what} starts at {v!r}, not at the base lr {b!r}; this torch-style schedule "
                               f"has no factor (give every join_schedules part the same start)")


def constant(v: float, where: str) -> Piece:
    def fit(b: float) -> dict[str, Any]:
        if v == b:
            return {"name": "constant"}
        f = _relative(v, b, where)
        if f == 0:
            raise UnsupportedError(f"{where}: a constant lr of 0 inside a schedule has no spec part")
        return {"name": "linear", "start_factor": f, "end_factor": f, "total_iters": 1}  # b·f for ever
    return Piece(None, v, fit, ("constant", v))


def _linear(init: float, end: float, n: int, where: str) -> Piece:
    def fit(b: float) -> dict[str, Any]:
        sf, ef = _relative(init, b, where), _relative(end, b, where)
        if sf > 0:
            return {"name": "linear", "start_factor": sf, "end_factor": ef, "total_iters": n}
        if end != b:
            raise UnsupportedError(f"{where}: a linear schedule from 0 must end at the base lr; torch's LinearLR "
                                   f"cannot start at 0")
        # a warm-up from 0 that then holds b: wsd with a one-update "decay" from b to b
        return {"name": "wsd", "warmup_steps": n, "start_factor": 0.0, "total_steps": n + 1, "decay_steps": 1,
                "eta_min": b}
    return Piece(None, max(init, end), fit, ("linear", init, end, n))


def _delayed(begin: int, init: float, main: Piece, where: str) -> list[Piece]:
    """transition_begin: hold init for `begin` updates, then the schedule from its own step 0."""
    if begin < 0:
        raise UnsupportedError(f"{where}.transition_begin must be >= 0; received {begin}")
    return ([constant(init, where)._replace(length=begin)] if begin else []) + [main]


def _exponential(a: dict[str, Any], where: str) -> list[Piece]:
    init, k = _number(a["init_value"], f"{where}.init_value"), a["transition_steps"]
    rate = _number(a["decay_rate"], f"{where}.decay_rate")
    k = _steps(k, f"{where}.transition_steps")
    end = None if a["end_value"] is None else _number(a["end_value"], f"{where}.end_value")
    if end is not None and (rate == 1 or init <= 0):
        raise UnsupportedError(f"{where}.end_value with decay_rate = {rate!r} and init_value = {init!r} has no spec "
                               f"form (a bound needs a decay or a growth from a positive lr)")

    def fit(b: float) -> dict[str, Any]:
        _equal(init, b, where)
        out = ({"name": "step", "step_size": k, "gamma": rate} if a["staircase"] else
               {"name": "exponential", "gamma": rate if k == 1 else rate ** (1.0 / k)})
        if end is not None:  # optax clips at end_value: a floor for a decay, a ceiling for a growth
            out["end_factor"] = end / init
        return out
    return _delayed(int(a["transition_begin"]), init, Piece(None, max(init, end or init), fit, ("exponential",), init),
                    where)


def _cosine(a: dict[str, Any], where: str) -> list[Piece]:
    init, steps = _number(a["init_value"], f"{where}.init_value"), _steps(a["decay_steps"], f"{where}.decay_steps")
    alpha = _number(a["alpha"], f"{where}.alpha")
    if a["exponent"] != 1.0:
        raise UnsupportedError(f"{where}.exponent = {a['exponent']!r}: twinstep's cosine has exponent 1")

    def fit(b: float) -> dict[str, Any]:
        _equal(init, b, where)
        # optax holds alpha·init after decay_steps: warmup_cosine without warm-up, convention "optax"
        return {"name": "warmup_cosine", "warmup_steps": 0, "total_steps": steps, "eta_min": alpha * init,
                "convention": "optax"}
    return [Piece(None, init, fit, ("cosine", init, steps, alpha * init), init)]


def _warmup_cosine(a: dict[str, Any], where: str) -> list[Piece]:
    init, peak = _number(a["init_value"], f"{where}.init_value"), _number(a["peak_value"], f"{where}.peak_value")
    w, total = a["warmup_steps"], _steps(a["decay_steps"], f"{where}.decay_steps")
    end = _number(a["end_value"], f"{where}.end_value")
    if a["exponent"] != 1.0:
        raise UnsupportedError(f"{where}.exponent = {a['exponent']!r}: twinstep's cosine has exponent 1")
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:
        raise UnsupportedError(f"{where}.warmup_steps must be an integer >= 0; received {w!r}")

    def fit(b: float) -> dict[str, Any]:
        _equal(peak, b, where)
        return {"name": "warmup_cosine", "warmup_steps": w, "total_steps": total, "eta_min": end,
                "start_factor": _relative(init, b, where), "convention": "optax"}
    return [Piece(None, max(init, peak), fit, ("warmup_cosine",), peak)]


def _polynomial(a: dict[str, Any], where: str) -> list[Piece]:
    init, end = _number(a["init_value"], f"{where}.init_value"), _number(a["end_value"], f"{where}.end_value")
    power, n = _number(a["power"], f"{where}.power"), _steps(a["transition_steps"], f"{where}.transition_steps")
    if power == 1.0:
        main = _linear(init, end, n, where)
    elif init > 0:
        def fit(b: float) -> dict[str, Any]:
            _equal(init, b, where)
            out = {"name": "polynomial", "total_iters": n, "power": power}
            return {**out, "end_factor": end / init} if end else out  # optax's end_value
        main = Piece(None, max(init, end), fit, ("polynomial",), init)
    else:
        raise UnsupportedError(f"{where}: a polynomial from init_value = {init!r} has no spec schedule (its "
                               f"end value is a factor of a positive start)")
    return _delayed(int(a["transition_begin"]), init, main, where)


def _piecewise(a: dict[str, Any], where: str) -> list[Piece]:
    init = _number(a["init_value"], f"{where}.init_value")
    table = a["boundaries_and_scales"] or {}
    try:
        points = sorted((int(k), _number(v, f"{where}.boundaries_and_scales[{k!r}]")) for k, v in table.items())
    except ValueError:
        raise ConfigError(f"{where}.boundaries_and_scales keys must be update counts; received "
                          f"{list(table)}") from None
    value = init
    while points and points[0][0] <= 0:  # optax applies a boundary <= 0 from the start
        value *= points.pop(0)[1]
    scales = {s for _, s in points}
    if len(scales) == 1 and value == init:
        gamma, milestones = scales.pop(), [m for m, _ in points]

        def fit(b: float) -> dict[str, Any]:
            _equal(init, b, where)
            return {"name": "multistep", "milestones": milestones, "gamma": gamma}
        return [Piece(None, init, fit, ("multistep",), init)]
    pieces, start = [], 0
    for boundary, scale in points:
        pieces.append(constant(value, where)._replace(length=boundary - start))
        value, start = value * scale, boundary
    return pieces + [constant(value, where)]


def _onecycle(a: dict[str, Any], where: str, kind: str) -> list[Piece]:
    total = _steps(a["transition_steps"], f"{where}.transition_steps")
    peak = _number(a["peak_value"], f"{where}.peak_value")
    first = int(a["pct_start"] * total)
    out = {"name": "onecycle", "total_steps": total + 1, "anneal_strategy": "cos" if kind == "cosine" else "linear",
           "div_factor": _number(a["div_factor"], f"{where}.div_factor"),
           "final_div_factor": _number(a["final_div_factor"], f"{where}.final_div_factor"),
           "cycle_momentum": False, "three_phase": kind == "linear"}
    if kind == "linear" and int(a["pct_final"] * total) != 2 * first:
        raise UnsupportedError(f"{where}: optax's phases end at int(pct_start·T) = {first} and int(pct_final·T) = "
                               f"{int(a['pct_final'] * total)}; torch's three-phase OneCycleLR needs the second "
                               f"at twice the first")
    # optax's phase boundaries are the integers int(pct·T) and T: torch's pct·(T + 1) − 1 with T + 1 steps
    pct = (first + 1) / (total + 1)
    for candidate in (pct, math.nextafter(pct, 1.0), math.nextafter(pct, 0.0)):
        if float(candidate * (total + 1)) - 1 == first:
            pct = candidate
            break
    out["pct_start"] = pct

    def fit(b: float) -> dict[str, Any]:
        _equal(peak, b, where)
        return out
    return [Piece(None, peak, fit, ("onecycle",), peak)]


def _join(parts: list[list[Piece]], boundaries: list[int], where: str) -> list[Piece]:
    if len(boundaries) != len(parts) - 1:
        raise ConfigError(f"{where}: join_schedules needs one boundary fewer than schedules")
    out, start = [], 0
    for i, pieces in enumerate(parts):
        length = boundaries[i] - start if i < len(boundaries) else None
        if length is not None and length <= 0:
            raise UnsupportedError(f"{where}.boundaries must increase; received {boundaries}")
        left = length
        for piece in pieces:
            if left is not None and left <= 0:
                break
            used = left if piece.length is None else (piece.length if left is None else min(piece.length, left))
            out.append(piece._replace(length=used))
            left = None if left is None else left - (used or 0)
        if i < len(boundaries):
            start = boundaries[i]
    return out


def pieces(desc: Any, where: str) -> list[Piece]:
    """A schedule description as pieces (see the module docstring)."""
    if isinstance(desc, (int, float)) and not isinstance(desc, bool):
        return [constant(_number(desc, where), where)]
    if not isinstance(desc, Mapping) or len(desc) != 1:
        raise ConfigError(f"{where} must be a number or one optax schedule {{name = {{arguments}}}}; "
                          f"received {desc!r}")
    (name, args), = desc.items()
    at = f"{where}.{name}"
    if name in REFUSED:
        raise UnsupportedError(f"optax.{name} cannot be translated: {REFUSED[name]}")
    if name not in SCHEDULES:
        raise UnsupportedError(f"{at}: twinstep reads the optax schedules {', '.join(SCHEDULES)}")
    a = arguments(name, args, at, SCHEDULES)
    if name == "constant_schedule":
        return [constant(_number(a["value"], f"{at}.value"), at)]
    if name == "exponential_decay":
        return _exponential(a, at)
    if name == "cosine_decay_schedule":
        return _cosine(a, at)
    if name == "warmup_cosine_decay_schedule":
        return _warmup_cosine(a, at)
    if name == "linear_schedule":
        init, end = _number(a["init_value"], f"{at}.init_value"), _number(a["end_value"], f"{at}.end_value")
        main = _linear(init, end, _steps(a["transition_steps"], f"{at}.transition_steps"), at)
        return _delayed(int(a["transition_begin"]), init, main, at)
    if name == "polynomial_schedule":
        return _polynomial(a, at)
    if name == "piecewise_constant_schedule":
        return _piecewise(a, at)
    if name in ("cosine_onecycle_schedule", "linear_onecycle_schedule"):
        return _onecycle(a, at, name.split("_")[0])
    if name == "join_schedules":
        parts = [pieces(s, f"{at}.schedules[{i}]") for i, s in enumerate(a["schedules"])]
        return _join(parts, [int(b) for b in a["boundaries"]], at)
    if name == "sgdr_schedule":
        kws = list(a["cosine_kwargs"])
        parts = [pieces({"warmup_cosine_decay_schedule": kw}, f"{at}.cosine_kwargs[{i}]") for i, kw in enumerate(kws)]
        bounds = [sum(int(kw["decay_steps"]) for kw in kws[:i + 1]) for i in range(len(kws) - 1)]
        return _join(parts, bounds, at)
    warm = {"init_value": a["init_value"], "end_value": a["peak_value"], "transition_steps": a["warmup_steps"]}
    if name == "warmup_constant_schedule":
        rest: dict[str, Any] = {"constant_schedule": {"value": a["peak_value"]}}
    else:
        rest = {"exponential_decay": {"init_value": a["peak_value"], **{k: a[k] for k in (
            "transition_steps", "decay_rate", "transition_begin", "staircase", "end_value")}}}
    return pieces({"join_schedules": {"schedules": [{"linear_schedule": warm}, rest],
                                      "boundaries": [a["warmup_steps"]]}}, where)


def _merge_warmup_cosine(parts: list[Piece]) -> list[Piece]:
    """join([linear(init -> P over W), cosine_decay(P, D, alpha)], [W]) is warmup_cosine(W, W + D)."""
    if len(parts) != 2 or parts[0].kind[:1] != ("linear",) or parts[1].kind[:1] != ("cosine",):
        return parts
    (_, init, end, n), (_, peak, steps, eta) = parts[0].kind, parts[1].kind
    if parts[0].length != n or end != peak:
        return parts

    def fit(b: float) -> dict[str, Any]:
        _equal(peak, b, "the cosine part")
        return {"name": "warmup_cosine", "warmup_steps": n, "total_steps": n + steps, "eta_min": eta,
                "start_factor": _relative(init, b, "the warm-up"), "convention": "optax"}
    return [Piece(None, max(init, peak), fit, ("warmup_cosine",), peak)]


def schedule(desc: Any, where: str) -> tuple[float, dict[str, Any]]:
    """(base lr, `[schedule]` table) of an optax learning_rate description."""
    parts = _merge_warmup_cosine(pieces(desc, where))
    anchors = [p.anchor for p in parts if p.anchor is not None]
    base = anchors[0] if anchors else max(p.peak for p in parts)  # fit() refuses anchors that disagree
    if len(parts) == 1:
        return base, parts[0].fit(base)
    milestones, total = [], 0
    for p in parts[:-1]:
        total += p.length  # type: ignore[operator]
        milestones.append(total)
    return base, {"name": "sequential", "milestones": milestones, "schedulers": [p.fit(base) for p in parts]}
