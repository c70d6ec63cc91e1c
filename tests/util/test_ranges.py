"""The one parser of the ``A-B,C`` syntax (laggard.util.ranges) and its two callers' limits."""

from __future__ import annotations

import pytest

from laggard.cli.collectives import parse_ranks
from laggard.errors import LaggardError
from laggard.optable.ops import parse_steps
from laggard.util.ranges import parse_ranges, parse_spans


@pytest.mark.parametrize(("spec", "want"), [
    ("7", {7}),
    ("10-12,25", {10, 11, 12, 25}),
    (" 4 - 6 , 9 ", {4, 5, 6, 9}),
    ("3-3", {3}),
    ("5,,6,", {5, 6}),        # empty items are skipped
    ("-3", {-3}),             # a leading '-' is a sign
    ("-3-1", {-3, -2, -1, 0, 1}),
    ("-3--2", {-3, -2}),
    ("2-4,3-5", {2, 3, 4, 5}),
    ("", set()),
])
def test_good_specs(spec: str, want: set[int]) -> None:
    assert parse_ranges(spec, flag="--x", example="1-2") == want


def test_spans_are_not_expanded() -> None:
    assert parse_spans("1-1000000000000,5", flag="--x", example="1-2") == [(1, 10**12), (5, 5)]


@pytest.mark.parametrize(("spec", "bad"), [
    ("abc", "abc"), ("4-a", "4-a"), ("9-4", "9-4"), ("1,2.5", "2.5"), ("1-2-3", "1-2-3"),
    ("3--1", "3--1"), ("-", "-"), ("4-", "4-"), ("1 0", "1 0"),
])
def test_bad_specs_name_the_bad_item(spec: str, bad: str) -> None:
    with pytest.raises(LaggardError) as e:
        parse_ranges(spec, flag="--x", example="1-2")
    assert str(e.value) == f"--x: cannot read {bad!r} (use e.g. '1-2')"


def test_parse_steps_keeps_its_messages() -> None:
    assert parse_steps("16-18,404") == {16, 17, 18, 404}
    with pytest.raises(LaggardError, match=r"^--steps: cannot read '30-16' \(use e.g. '10-20,25'\)$"):
        parse_steps("30-16")
    with pytest.raises(LaggardError, match="^--steps: no step given$"):
        parse_steps(" , ")


def test_parse_ranks_keeps_its_limits() -> None:
    assert parse_ranks("16,4-6,5") == [4, 5, 6, 16]
    with pytest.raises(LaggardError, match=r"^--ranks: rank counts must be in 2\.\.1024, got 1$"):
        parse_ranks("1-8", maximum=1024)
    with pytest.raises(LaggardError, match=r"^--ranks: rank counts must be in 2\.\.4096, got 10000000000$"):
        parse_ranks("2-10000000000")  # refused before expanding
    with pytest.raises(LaggardError, match="^--ranks: at most 1024 rank counts at once, got 1025$"):
        parse_ranks("2-1026")
    with pytest.raises(LaggardError, match=r"^--ranks: cannot read '4-a' \(use e.g. '4-8,16'\)$"):
        parse_ranks("8,4-a")
    with pytest.raises(LaggardError, match="^--ranks: no rank count given$"):
        parse_ranks("")
