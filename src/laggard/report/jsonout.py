"""JSON output: orjson, numpy-aware, to a file or stdout ('-'). The one JSON writer of laggard's outputs
(analysis, collectives, simulate, ...): indented by 2, and NaN and +-inf become null (orjson's rule)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from laggard.errors import LaggardError


def dumps(obj: Any) -> bytes:
    if hasattr(obj, "to_json"):
        obj = obj.to_json()
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)


def dump_json(obj: Any, out: str | Path, *, flag: str | None = None) -> None:
    """Write ``obj`` (or its ``to_json()``) to the file ``out`` or to stdout ('-'); ``flag`` (e.g. '--json')
    leads the message when the file cannot be written."""
    data = dumps(obj) + b"\n"
    if str(out) == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_bytes(data)
    except OSError as e:
        raise LaggardError(f"{f'{flag} ' if flag else ''}{out}: cannot write ({e.strerror})") from None


write_json = dump_json
