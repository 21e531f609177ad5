"""core/units.py: sizes and durations as the user writes them, parsed at the edge, and a duration said back."""

from __future__ import annotations

import pytest

from trainwise.core.errors import ConfigError
from trainwise.core.units import human_seconds, parse_bytes, parse_seconds


def test_sizes_in_decimal_and_binary_units():
    assert parse_bytes("11GB") == 11 * 10**9 and parse_bytes("11GiB") == 11 * 2**30
    assert parse_bytes(" 512 MiB ") == 512 * 2**20 and parse_bytes("2.5gb") == 2_500_000_000
    assert parse_bytes("4096") == 4096 and parse_bytes("1k") == 1000


@pytest.mark.parametrize("text", ["", "GB", "11 parsecs", "-1GB", "0", "1.2.3GB"])
def test_a_size_that_is_no_size_is_one_line_naming_the_option(text):
    with pytest.raises(ConfigError, match=r"^--device-memory "):
        parse_bytes(text, "--device-memory")


def test_durations_and_their_units():
    assert parse_seconds("90s", "--x") == 90 and parse_seconds("30m", "--x") == 1800
    assert (
        parse_seconds("2.5h", "--x") == 9000
        and parse_seconds("120", "--x") == 120
        and parse_seconds("1d", "--x") == 86400
    )
    for bad in ("0", "-5m", "5 fortnights", ""):
        with pytest.raises(ConfigError, match="give a positive duration"):
            parse_seconds(bad, "--max-search-time")


def test_a_duration_said_as_a_person_says_it():
    assert human_seconds(0.4) == "0 s" and human_seconds(-3) == "0 s" and human_seconds(89.4) == "89 s"
    assert human_seconds(90) == "2 min" and human_seconds(12 * 60) == "12 min"
    assert human_seconds(2 * 3600 + 41 * 60) == "2 h 41 min" and human_seconds(90 * 60) == "1 h 30 min"
