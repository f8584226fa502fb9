"""One manifest line as a JSON value, decoded on its own: a line that is not one acceptable JSON
object is that line's error (:class:`LineError`), never the run's.

Why its own module: the refusals here are about bytes and JSON, before any field means anything
(not UTF-8, too long, nested too deep, a duplicate key, an integer too long to parse safely,
``NaN``), and :mod:`cosyclone.manifest` checks the fields of what comes out.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 6  # JSON nesting a line may have: the row object, its meta object and four levels inside that
MAX_LINE_BYTES = 1 << 20  # a longer line is refused unread: no text the talker can take comes near it
MAX_INT_DIGITS = 20  # longer integer literals are refused unparsed (2**64 - 1 has 20 digits)


class LineError(Exception):
    """A line that is not one acceptable JSON object; ``key`` names the offending key when there is one."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def decode_line(raw: bytes | str) -> object:
    """One manifest line as a JSON value, or :class:`LineError` saying why it is not one.

    Refused before or while parsing: bytes that are not UTF-8 (with the byte and its column),
    lines over :data:`MAX_LINE_BYTES`, nesting past :data:`MAX_DEPTH` (found by a scan that
    never recurses), duplicate keys, integer literals over :data:`MAX_INT_DIGITS` digits (never
    turned into a huge int) and ``NaN``/``Infinity`` (not JSON).
    """
    if len(raw) > MAX_LINE_BYTES:
        raise LineError(f"line is {len(raw)} bytes; a manifest row is at most {MAX_LINE_BYTES} bytes")
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LineError(
                f"not UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} ({exc.reason}); "
                "save the manifest as UTF-8"
            ) from None
    else:
        text = raw
    depth = _max_depth(text)
    if depth > MAX_DEPTH:
        raise LineError(
            f"nested {depth} levels deep; a row is at most {MAX_DEPTH} levels deep (its meta object "
            f"and {MAX_DEPTH - 2} levels inside it)"
        )
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_bounded_int,
                          parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise LineError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:  # unreachable after the depth scan; kept so no line can end a run
        raise LineError("nested too deep to parse") from None


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?')  # a JSON string (or an unterminated one, to the end)
_BRACKET = re.compile(r"[\[\]{}]")


def _max_depth(text: str) -> int:
    """The deepest bracket nesting of ``text`` outside strings (no recursion, linear time)."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub('""', text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise LineError(f"duplicate key {key[:80]!r} in one object (which one is meant?)", key=key)
        seen[key] = value
    return seen


def _bounded_int(literal: str) -> int:
    digits = len(literal.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise LineError(
            f"an integer of {digits} digits; at most {MAX_INT_DIGITS} (a seed is at most 2**64-1)"
        )
    return int(literal)


def _no_constant(name: str) -> Any:
    raise LineError(f"{name} is not a JSON number")


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters; never raises (a huge int's repr can)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."
