"""What a step may carry: values JSON can hold (SPEC §2), and the few others whose text is the
same in every process, which come back as that text, as they will in replay (SPEC §6: bytes,
datetimes, dates, times, durations, decimals, UUIDs). Anything else (a set, an arbitrary object,
NaN, an infinity, a str holding a lone surrogate) is refused before it is sent or recorded, naming
the step and the JSON path of the value: stringified, a set would come back in an order that
varies between processes, and replay would diverge at random; a lone surrogate (what
``errors="surrogateescape"`` makes of bytes that aren't UTF-8) is no Unicode character, and the
daemon would refuse the whole step, after its live function had run. :func:`text` checks a name
(an agent's, a tool's, a run's) the same way."""
from __future__ import annotations

import datetime
import decimal
import json
import math
import re
import reprlib
import unicodedata
import uuid
from typing import Any, Optional

from ._errors import RetraceError

# Values whose str() is the same in every process and every run (not a set's, not an object's
# default repr with its address): they travel as that text.
_AS_TEXT = (bytes, datetime.date, datetime.time, datetime.timedelta, decimal.Decimal, uuid.UUID)


def _as_text(value: Any) -> str:
    if isinstance(value, _AS_TEXT):
        return str(value)
    raise TypeError(type(value).__name__)


def plain(value: Any, what: str) -> Any:
    """``value`` as replay hands it back (a JSON round trip: tuples become lists), or a
    :class:`RetraceError` (``not_json``) whose message starts with ``what``, which names the step
    and the part (``"tool 'q' of agent 'a': the arguments hold"``)."""
    try:
        text = json.dumps(value, allow_nan=False, default=_as_text)
    except (TypeError, ValueError):
        path, bad = _unencodable(value, "$", ()) or ("$", "a value")
        raise RetraceError(0, "not_json", f"{what} {bad} at {path}, which JSON can't hold: convert it to "
                           "dict, list, str, int, a finite float, bool or None first") from None
    # json escapes every surrogate (`\udc80`), paired or lone: the walk only on such an escape.
    if _SURROGATE_ESCAPE.search(text):
        found = _lone_surrogate(value, "$", ())
        if found:
            path, bad = found
            raise RetraceError(0, "not_json", f"{what} {bad} at {path}, which JSON can't hold: {_VALID_TEXT}")
    # An int beyond 64 bits has 19 digits or more; the daemon would keep only its nearest double,
    # so two different ids would share a key. The cheap search first, the walk only on a hit.
    if _LONG_DIGITS.search(text):
        found = _wide_int(value, "$", ())
        if found:
            path, number = found
            raise RetraceError(0, "not_json", f"{what} the int {number} at {path}, beyond 64 bits, which a "
                               "step can't keep exactly: pass it as a string (str(n)) first")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _SameKey as same:
        raise RetraceError(0, "not_json", f"{what} two keys of one dict that JSON writes as the same string "
                           f"{json.dumps(same.key)} (keys become strings: 1 and \"1\", True and \"true\"), so one "
                           "would be lost: rename one first") from None


class _SameKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """A JSON object's dict; two keys that stringified alike (``{1: .., "1": ..}``) refused."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        raise _SameKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


def text(value: Any, what: str) -> Any:
    """``value`` (a name: an agent's, a tool's, a run's...), or a :class:`RetraceError`
    (``not_json``) whose message starts with ``what`` when it is a str holding a lone surrogate,
    which JSON can't hold (``"tool 'q' of agent 'a': its name holds"``)."""
    if isinstance(value, str):
        found = _LONE.search(value)
        if found:
            raise RetraceError(0, "not_json", f"{what} the lone surrogate {found.group()!r}, which JSON can't "
                               f"hold: {_VALID_TEXT}")
    return value


# A surrogate not paired as high then low: no Unicode character, so no UTF-8 and no JSON text.
# (A pair is one character split in two, as json writes it: it travels as that character.)
_LONE = re.compile(r"[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\ud[89a-f]")
_VALID_TEXT = 'decode bytes with errors="replace" (or pass the bytes themselves, which travel as their text) first'
_LONG_DIGITS = re.compile(r"\d{19}")
_INT_RANGE = (-(2 ** 63), 2 ** 64 - 1)


def _wide_int(value: Any, path: str, parents: tuple) -> Optional[tuple]:
    """The JSON path of the first int in ``value`` beyond 64 bits, and the int."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, float) + _AS_TEXT):
        return None
    if isinstance(value, int):
        return None if _INT_RANGE[0] <= value <= _INT_RANGE[1] else (path, value)
    if id(value) in parents:
        return None
    inner = parents + (id(value),)
    if isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"{path}.{k}" if isinstance(k, str) and k.isidentifier() else f"{path}[{json.dumps(str(k))}]", v)
                 for k, v in value.items())
    else:
        return None
    for at, item in items:
        found = _wide_int(item, at, inner)
        if found:
            return found
    return None


def _lone_surrogate(value: Any, path: str, parents: tuple) -> Optional[tuple]:
    """The JSON path of the first str in ``value`` (a dict's key included) that holds a lone
    surrogate, and what it is."""
    if isinstance(value, str):
        found = _LONE.search(value)
        return (path, f"the lone surrogate {found.group()!r} in the str {reprlib.repr(value)}") if found else None
    if id(value) in parents or not isinstance(value, (list, tuple, dict)):
        return None
    inner = parents + (id(value),)
    if isinstance(value, dict):
        for key, item in value.items():
            at = f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{json.dumps(str(key))}]"
            found = isinstance(key, str) and _LONE.search(key)
            if found:
                return at, f"the lone surrogate {found.group()!r} in the key {reprlib.repr(key)}"
            found = _lone_surrogate(item, at, inner)
            if found:
                return found
        return None
    for i, item in enumerate(value):
        found = _lone_surrogate(item, f"{path}[{i}]", inner)
        if found:
            return found
    return None


def _unencodable(value: Any, path: str, parents: tuple) -> Optional[tuple]:
    """The JSON path of the first part of ``value`` that JSON can't hold, and what it is."""
    if value is None or isinstance(value, (str, int) + _AS_TEXT):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"float {value!r}")
    if id(value) in parents:
        return path, "a circular reference"
    inner = parents + (id(value),)
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _unencodable(item, f"{path}[{i}]", inner)
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            at = f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{json.dumps(str(key))}]"
            # json writes these keys as strings; any other key (a tuple, bytes, NaN) it refuses.
            if not (key is None or isinstance(key, (str, int)) or (isinstance(key, float) and math.isfinite(key))):
                return at, f"the {type(key).__name__} key {reprlib.repr(key)}"
            found = _unencodable(item, at, inner)
            if found:
                return found
        return None
    name, shown = type(value).__name__, reprlib.repr(value)
    # A default repr (`<Foo object at 0x...>`) says no more than the type.
    return path, f"an instance of {name}" if shown.startswith("<") else f"{name} {shown}"


def checked_name(name: str, what: str, most: int) -> None:
    """An agent id (1 to 256 characters) or a role (1 to 128), none a control character, as the
    daemon checks them."""
    if not name:
        raise RetraceError(0, "usage", f"{what} is empty")
    if not name.strip():
        raise RetraceError(0, "usage", f"{what} {name!r} is blank")
    if len(name) > most:
        raise RetraceError(0, "usage", f"{what} is {len(name)} characters long; at most {most}")
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise RetraceError(0, "usage", f"{what} {name!r} holds a control character")
