"""A small TOML writer that keeps configs and case files readable.

Numeric arrays stay inline (`betas = [0.9, 0.999]`, one row per line for 2-D and deeper), lists of
tables become `[[section.key]]` blocks, tables nested inside arrays become inline tables, and
floats use the shortest repr that round-trips exactly. `None` values are left out (absent = None).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k, ensure_ascii=False)


def _scalar(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return repr(f)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table(v: Any) -> bool:
    return isinstance(v, Mapping)


def _is_list(v: Any) -> bool:
    return isinstance(v, (list, tuple, np.ndarray))


def _inline(v: Any, indent: int = 0) -> str:
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if _is_table(v):
        items = [f"{_key(k)} = {_inline(x)}" for k, x in v.items() if x is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if _is_list(v):
        items = list(v)
        if items and all(_is_list(x) for x in items):  # 2-D and deeper: one row per line
            pad = "    " * (indent + 1)
            rows = ",\n".join(pad + _inline(x, indent + 1) for x in items)
            return "[\n" + rows + ",\n" + "    " * indent + "]"
        return "[" + ", ".join(_inline(x, indent) for x in items) + "]"
    return _scalar(v)


def _is_table_list(v: Any) -> bool:
    return _is_list(v) and len(v) > 0 and all(_is_table(x) for x in v)


def _emit(table: Mapping[str, Any], path: list[str], out: list[str]) -> None:
    plain = {k: v for k, v in table.items() if v is not None and not _is_table(v) and not _is_table_list(v)}
    for k, v in plain.items():
        out.append(f"{_key(k)} = {_inline(v)}")
    for k, v in table.items():
        if _is_table(v):
            sub = [*path, k]
            out.append("")
            out.append("[" + ".".join(_key(p) for p in sub) + "]")
            _emit(v, sub, out)
    for k, v in table.items():
        if _is_table_list(v):
            sub = [*path, k]
            for item in v:
                out.append("")
                out.append("[[" + ".".join(_key(p) for p in sub) + "]]")
                _emit(item, sub, out)


def dumps(data: Mapping[str, Any]) -> str:
    """Serialize a mapping to TOML text (parsed back by tomllib to the same values)."""
    out: list[str] = []
    _emit(data, [], out)
    text = "\n".join(out).lstrip("\n")
    return text + "\n"
