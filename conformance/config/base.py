"""Strict config building blocks: the base section, constrained number types, one-line errors.

Every section is a frozen pydantic v2 model in strict mode: no coercion ("1e-3" is not a number),
no unknown keys, no NaN/Inf. Validation errors become one `ConfigError` line that names the field
path and the received value, e.g. ``optimizer.betas[1] must be in [0, 1); received 1.5``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from conformance.errors import ConfigError

_FIELD_MARK = "\x00"  # separates a sub-field name from its message inside a ValueError text


class Section(BaseModel):
    """Base of every config section and case table: strict, frozen, no extra keys, finite numbers."""

    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, allow_inf_nan=False, validate_default=True
    )

    def reject_unused(self, used_by: Mapping[str, Iterable[str]], selector: str) -> None:
        """Raise if a field that only some variants use was set for another variant.

        `used_by` maps field name -> the values of `selector` (e.g. loss names) that read it.
        """
        chosen = getattr(self, selector)
        for name, owners in used_by.items():
            owners = tuple(owners)
            if chosen in owners or name not in self.model_fields_set:
                continue
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            value = getattr(self, name)
            if value != default:
                where = ", ".join(owners)
                raise field_error(
                    name,
                    f"is only used when {selector} is {where}; received {value!r} with "
                    f"{selector} = {chosen!r}",
                )


def field_error(field: str, message: str) -> ValueError:
    """A ValueError for a cross-field check that the formatter attaches to `field`."""
    return ValueError(f"{field}{_FIELD_MARK}{message}")


def _range_check(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> Callable:
    left = "(" if lo_open else "["
    right = ")" if hi_open else "]"
    if lo is not None and hi is not None:
        text = f"must be in {left}{_num(lo)}, {_num(hi)}{right}"
    elif lo is not None:
        text = f"must be {'>' if lo_open else '>='} {_num(lo)}"
    else:
        text = f"must be {'<' if hi_open else '<='} {_num(hi)}"

    def check(value: float) -> float:
        bad = (
            (lo is not None and (value <= lo if lo_open else value < lo))
            or (hi is not None and (value >= hi if hi_open else value > hi))
        )
        if bad:
            raise PydanticCustomError("range", text)
        return value

    return check


def _num(x: float) -> str:
    if x == INT64_MAX:
        return "2^63 - 1"
    if x == INT64_MIN:
        return "-2^63"
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def FloatIn(
    lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False
) -> Any:
    """A finite float constrained to an interval, with a readable error."""
    return Annotated[float, AfterValidator(_range_check(lo, hi, lo_open, hi_open))]


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def IntIn(lo: int | None = None, hi: int | None = None) -> Any:
    """An integer (not a bool) constrained to a closed interval; always within int64 (what every
    framework, NumPy and JSON reader can hold)."""
    lo = INT64_MIN if lo is None else max(lo, INT64_MIN)
    hi = INT64_MAX if hi is None else min(hi, INT64_MAX)
    return Annotated[int, AfterValidator(_range_check(lo, hi, False, False))]


def _list_to_tuple(value: Any) -> Any:
    # TOML has arrays, not tuples; strict mode would otherwise refuse every list.
    return tuple(value) if isinstance(value, list) else value


def Pair(item: Any) -> Any:
    """A 2-tuple given as a TOML array, e.g. ``betas = [0.9, 0.999]``."""
    return Annotated[tuple[item, item], BeforeValidator(_list_to_tuple)]


Positive = FloatIn(0.0, lo_open=True)
NonNegative = FloatIn(0.0)
UnitClosed = FloatIn(0.0, 1.0)
UnitHalfOpen = FloatIn(0.0, 1.0, hi_open=True)
PosInt = IntIn(1)
NonNegInt = IntIn(0)


# ----------------------------------------------------------------------------------------------
# Error formatting
# ----------------------------------------------------------------------------------------------


def format_loc(loc: Iterable[Any], prefix: str = "") -> str:
    """('optimizer', 'betas', 1) -> 'optimizer.betas[1]'."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-", "tagged-union", "list[", "tuple[", "dict[")):
            continue  # pydantic's internal validator names are not field names
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fields_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (sub)model reached by following `loc` from `model`."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The BaseModel class inside an annotation like `X | None` or `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    meta = getattr(annotation, "__origin__", None)
    return _model_in(meta) if meta is not None and meta is not annotation else None


def describe_error(err: Mapping[str, Any], model: type[BaseModel] | None, prefix: str) -> str:
    """One pydantic error dict -> 'field.path message; received value'."""
    loc = tuple(err.get("loc", ()))
    kind = err.get("type", "")
    msg = str(err.get("msg", ""))
    value = err.get("input")
    if kind == "extra_forbidden":
        known = _fields_at(model, loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        did = f" (did you mean {hint[0]!r}?)" if hint else ""
        allowed = f"; known keys: {', '.join(known)}" if known and not hint else ""
        return f"{format_loc(loc, prefix)} is not a known key{did}{allowed}"
    if kind == "missing":
        return f"{format_loc(loc, prefix)} is required"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
        if _FIELD_MARK in msg:
            sub, msg = msg.split(_FIELD_MARK, 1)
            return f"{format_loc((*loc, *_split_sub(sub)), prefix)} {msg}"
        if not loc and not prefix:
            return msg  # a whole-config check whose message names its own fields
        return f"{format_loc(loc, prefix)}: {msg}"
    msg = msg.replace("Input should be", "must be").replace("Input should", "must")
    if kind in ("literal_error", "enum"):
        msg = msg.replace("must be ", "must be one of ", 1)
        options = re.findall(r"'([^']*)'", msg)
        hint = difflib.get_close_matches(str(value), options, n=1)
        if hint:
            return f"{format_loc(loc, prefix)} {msg}; received {_short(value)} (did you mean {hint[0]!r}?)"
    if isinstance(value, float) and not math.isfinite(value):
        msg = "must be a finite number"
    if isinstance(value, Mapping) and kind == "model_type":
        return f"{format_loc(loc, prefix)} {msg}"
    return f"{format_loc(loc, prefix)} {msg}; received {_short(value)}"


def _split_sub(sub: str) -> tuple[Any, ...]:
    # "groups[1].lr" -> ("groups", 1, "lr")
    parts: list[Any] = []
    for piece in sub.split("."):
        while "[" in piece:
            head, rest = piece.split("[", 1)
            if head:
                parts.append(head)
            index, piece = rest.split("]", 1)
            parts.append(int(index))
        if piece:
            parts.append(piece)
    return tuple(parts)


def one_line(exc: ValidationError, model: type[BaseModel] | None = None, prefix: str = "") -> str:
    """A whole ValidationError as one line: the first problem, plus how many more there are."""
    errors = exc.errors(include_url=False)
    first = describe_error(errors[0], model, prefix)
    return first if len(errors) == 1 else f"{first} [+{len(errors) - 1} more]"


def _big(value: int) -> str:
    return str(value) if value.bit_length() <= 256 else f"an integer of {value.bit_length()} bits"


def check_plain(data: Any, prefix: str = "", error: type = ConfigError, max_depth: int = 32) -> None:
    """Refuse, before validation, what no field may hold: an integer outside int64 anywhere (seed
    2^70, a list of milestones) and nesting deeper than `max_depth` (a dict built in Python can
    nest as deeply as a TOML bomb). Iterative: nothing here can exhaust the recursion limit."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        value, loc = stack.pop()
        if len(loc) > max_depth:
            raise error(f"{format_loc(loc[:max_depth], prefix)} nests more than {max_depth} levels deep")
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            raise error(f"{format_loc(loc, prefix)} must fit in 64 bits (an integer in [-2^63, 2^63)); "
                        f"received {_big(value)}")
        if isinstance(value, Mapping):
            stack.extend((v, (*loc, k)) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, (*loc, i)) for i, v in enumerate(value))


def validate(model: type[BaseModel], data: Any, prefix: str = "", error: type = ConfigError) -> Any:
    """Validate `data` as `model`, turning pydantic's report into one `error` line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(one_line(exc, model, prefix)) from None
