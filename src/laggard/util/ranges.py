"""The ``A-B,C`` range syntax of ``--steps`` and ``--ranks``: one parser, no numpy.

A spec is a comma list of items; an item is an integer ``N`` or an inclusive range ``A-B`` with
``A <= B``. Whitespace around items and numbers is ignored, empty items are skipped, and a leading
``-`` is a sign (``-3-2`` is -3 to 2). Each caller adds its own limits and its "nothing given" message.
"""

from __future__ import annotations

from laggard.errors import LaggardError


def parse_spans(spec: str, *, flag: str, example: str) -> list[tuple[int, int]]:
    """The items of ``spec`` as inclusive ``(lo, hi)`` pairs, in the order given (not expanded, so a
    caller can check bounds before building a huge set). A bad item raises one line naming it:
    ``{flag}: cannot read '{item}' (use e.g. '{example}')``."""
    spans: list[tuple[int, int]] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        cut = part.find("-", 1)  # from 1: a leading '-' is the sign of A
        try:
            lo, hi = (int(part), int(part)) if cut < 0 else (int(part[:cut]), int(part[cut + 1:]))
        except ValueError:
            lo, hi = 1, 0
        if hi < lo:
            raise LaggardError(f"{flag}: cannot read {part!r} (use e.g. '{example}')")
        spans.append((lo, hi))
    return spans


def expand(spans: list[tuple[int, int]]) -> set[int]:
    """Every integer the spans cover."""
    out: set[int] = set()
    for lo, hi in spans:
        out.update(range(lo, hi + 1))
    return out


def parse_ranges(spec: str, *, flag: str, example: str) -> set[int]:
    """``'10-20,25'`` -> ``{10, ..., 20, 25}`` (empty when the spec has no items)."""
    return expand(parse_spans(spec, flag=flag, example=example))
