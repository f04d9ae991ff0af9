"""What a step may carry: values JSON can hold (SPEC §2), and the few others whose text is the
same in every process, which come back as that text, as they will in replay (SPEC §6: bytes,
datetimes, dates, times, durations, decimals, UUIDs). Anything else (a set, an arbitrary object,
NaN, an infinity) is refused before it is sent or recorded, naming the step and the JSON path of
the value: stringified, a set would come back in an order that varies between processes, and
replay would diverge at random."""
from __future__ import annotations

import datetime
import decimal
import json
import math
import re
import reprlib
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
    # An int beyond 64 bits has 19 digits or more; the daemon would keep only its nearest double,
    # so two different ids would share a key. The cheap search first, the walk only on a hit.
    if _LONG_DIGITS.search(text):
        found = _wide_int(value, "$", ())
        if found:
            path, number = found
            raise RetraceError(0, "not_json", f"{what} the int {number} at {path}, beyond 64 bits, which a "
                               "step can't keep exactly: pass it as a string (str(n)) first")
    return json.loads(text)


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
