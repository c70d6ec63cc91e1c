"""A known defect of torch.profiler's JSON export, repaired where a chunk of events fails to decode.

``export_chrome_trace`` writes each event's name between quotes without escaping it. With
``with_stack=True`` the names include Python frames, and a frame whose function name holds a quote
makes the file invalid JSON (seen in a real trace of the demo job: ``"name": "pyarrow/parquet/core.py(0): "",``
on the Tracer's writer thread), so the whole rank could not be read. The exporter writes one field a
line, so a ``"name": "..."`` line is repaired by escaping the quotes inside its value."""

from __future__ import annotations

import re

# a name field on its own line, as the exporter writes it: the value is everything up to the last
# quote of the line (then an optional comma)
_NAME_LINE = re.compile(rb'^([ \t]*"name": ")(.*)("[ \t]*,?[ \t]*\r?)$', re.M)
_BARE_QUOTE = re.compile(rb'(?<!\\)((?:\\\\)*)"')


def repair_names(data: bytes) -> tuple[bytes, int]:
    """``data`` with the unescaped quotes inside each name value escaped, and how many lines changed."""
    changed = 0

    def fix(m: re.Match[bytes]) -> bytes:
        nonlocal changed
        value = _BARE_QUOTE.sub(rb'\1\\"', m.group(2))
        if value == m.group(2):
            return m.group(0)
        changed += 1
        return m.group(1) + value + m.group(3)

    out = _NAME_LINE.sub(fix, data)
    return out, changed


__all__ = ["repair_names"]
