"""TOML in and out: a bounded reader that names what is wrong, and a writer that keeps configs and
case files readable.

Reading (`parse`): tomllib parses recursively, so 5000 levels of `[[[[...` end in a RecursionError,
and it reports a duplicate key as "Cannot overwrite a value (at line 3, column 9)". `parse` first
measures the nesting of arrays and inline tables (strings and comments skipped) and refuses more than
MAX_DEPTH levels before tomllib sees the text, measures the parsed tables' depth (dotted keys and
`[a.b.c]` headers nest too), and names a duplicate key or table with its line.

Writing (`dumps`): numeric arrays stay inline (`betas = [0.9, 0.999]`, one row per line for 2-D
and deeper), lists of tables become `[[section.key]]` blocks, tables nested inside arrays become
inline tables, and floats use the shortest repr that round-trips exactly. `None` values are left
out (absent = None).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from typing import Any

import numpy as np

MAX_DEPTH = 32  # a config nests 3-4 levels; a case file's arrays a few more

# strings (multi-line first) and comments, whose brackets do not nest anything; and the brackets
_TOKENS = re.compile(r'''"""(?:[^\\]|\\.)*?"""|\'\'\'.*?\'\'\'|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|#[^\n]*|[\[\]{}]''',
                     re.S)


def nesting(text: str) -> int:
    """The deepest nesting of brackets and braces in TOML text, outside strings and comments."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth = max(depth - 1, 0)
    return deepest


def depth_of(value: Any) -> int:
    """How deeply tables and arrays nest in a parsed value (iteratively: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children = list(node.values())
        elif isinstance(node, (list, tuple)):
            children = list(node)
        else:
            continue
        deepest = max(deepest, depth + 1)
        if depth + 1 > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _duplicate(text: str, message: str) -> str | None:
    # tomllib: "Cannot overwrite a value (at line 3, column 9)" / "Cannot declare ('run',) twice (...)"
    declared = re.match(r"Cannot declare \((.*)\) twice \(at line (\d+)", message)
    if declared:
        name = ".".join(re.findall(r"'([^']*)'", declared.group(1)))
        return f"table [{name}] is declared twice (line {declared.group(2)})"
    if not message.startswith("Cannot overwrite a value"):
        return None
    lines = text.splitlines()
    at = re.search(r"at line (\d+)", message)
    index = int(at.group(1)) - 1 if at else max(i for i, line in enumerate(lines) if line.strip()) if lines else 0
    if not 0 <= index < len(lines):
        return None
    key = re.match(r"\s*([^=\[#]+?)\s*=", lines[index])
    if key is None:
        header = re.match(r"\s*\[+\s*([^\]]+?)\s*\]", lines[index])
        return f"[{header.group(1)}] redefines a key set before (line {index + 1})" if header else None
    table = next((m.group(1) for line in reversed(lines[:index])
                  if (m := re.match(r"\s*\[+\s*([^\]]+?)\s*\]", line))), "")
    name = f"{table}.{key.group(1)}" if table else key.group(1)
    return f"duplicate key {name.replace(' ', '')} (line {index + 1}; each key may be set once)"


def parse(text: str, where: str = "", error: type[Exception] = ValueError) -> dict[str, Any]:
    """Parse TOML text with bounded nesting (see the module docstring); every problem is one
    `error` line starting with `where`."""
    prefix = f"{where}: " if where else ""
    if nesting(text) > MAX_DEPTH:
        raise error(f"{prefix}arrays or inline tables nest more than {MAX_DEPTH} levels deep")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{prefix}{_duplicate(text, str(exc)) or f'invalid TOML: {exc}'}") from None
    except (RecursionError, ValueError) as exc:  # ValueError: an integer of more than 4300 digits
        raise error(f"{prefix}cannot be parsed ({type(exc).__name__}: {exc})") from None
    if depth_of(data) > MAX_DEPTH:
        raise error(f"{prefix}tables or arrays nest more than {MAX_DEPTH} levels deep")
    return data

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


# json.dumps(s, ensure_ascii=False) without building a new encoder per call
_STRING = json.JSONEncoder(ensure_ascii=False).encode


def _key(k: str) -> str:
    return k if _BARE.match(k) else _STRING(k)


def _scalar(v: Any) -> str:
    if type(v) is str:  # the common case first (a whole config is written at every run's start)
        return _STRING(v)
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
        return _STRING(v)
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _is_table(v: Any) -> bool:
    return type(v) is dict or isinstance(v, Mapping)


def _is_list(v: Any) -> bool:
    return type(v) is list or isinstance(v, (list, tuple, np.ndarray))


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
