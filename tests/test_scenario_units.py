"""Unit strings: exact conversions to SI base units, clear errors, and formatting back."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from exonet.errors import ScenarioError
from exonet.units import (
    MAX_TIME,
    RATE_UNITS,
    SIZE_UNITS,
    TIME_UNITS,
    format_bytes,
    format_rate,
    format_time,
    parse_rate,
    parse_size,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 Gbit/s", 125e6),
        ("1 Gbps", 125e6),
        ("10 Gb/s", 1.25e9),
        ("100 Mbit/s", 12.5e6),
        ("100 kbit/s", 12_500.0),
        ("400 Gbit/s", 50e9),
        ("8 bit/s", 1.0),
        ("125 MB/s", 125e6),
        ("1 GiB/s", 2.0**30),
        ("1 kB/s", 1000.0),
        ("2.5 Mbps", 312_500.0),
        ("100Mbit/s", 12.5e6),
        ("  1e3 Mbit/s ", 125e6),
        (".5 Gbit/s", 62.5e6),
    ],
)
def test_rates_are_bytes_per_second(text: str, expected: float) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4 MB", 4e6), ("4 MiB", 4_194_304.0), ("512 KiB", 524_288.0), ("1 GB", 1e9), ("6 MiB", 6 * 2.0**20), ("0 B", 0.0),
     ("3 bytes", 3.0)],
)
def test_sizes_are_bytes(text: str, expected: float) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30 ms", 0.03),
        ("200 us", 2e-4),
        ("200 \u00b5s", 2e-4),
        ("200 \u03bcs", 2e-4),
        ("1.5 s", 1.5),
        ("5 ns", 5e-9),
        ("2 min", 120.0),
        ("1 h", 3600.0),
        ("0 s", 0.0),
        ("37 ms", 0.037),
    ],
)
def test_times_are_seconds(text: str, expected: float) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    ("parse", "value", "fragments"),
    [
        (parse_rate, 100, ["no unit", "Mbit/s"]),
        (parse_rate, 1.5, ["no unit"]),
        (parse_rate, "100", ["no unit"]),
        (parse_rate, "100 mbit/s", ["unknown rate unit", "did you mean 'Mbit/s'"]),
        (parse_rate, "100 Mbits", ["unknown rate unit"]),
        (parse_rate, "100 MB", ["unknown rate unit"]),
        (parse_rate, "0 Gbit/s", ["must be positive"]),
        (parse_rate, "-1 Gbit/s", ["must be positive"]),
        (parse_rate, "nan Gbit/s", ["cannot read"]),
        (parse_rate, "inf Gbit/s", ["cannot read"]),
        (parse_rate, "1e999 Gbit/s", ["too large"]),
        (parse_rate, "Gbit/s", ["cannot read"]),
        (parse_rate, None, ["expected a rate"]),
        (parse_rate, True, ["expected a rate"]),
        (parse_rate, ["1 Gbit/s"], ["expected a rate"]),
        (parse_size, "4 Mb", ["unknown size unit", "MB"]),
        (parse_size, "-4 MB", ["non-negative"]),
        (parse_time, "30", ["no unit", "30 ms"]),
        (parse_time, "30 msec", ["unknown time unit"]),
        (parse_time, "-1 s", ["non-negative"]),
        (parse_time, "1 Mbit/s", ["unknown time unit"]),
    ],
)
def test_bad_quantities_name_the_field_and_show_examples(parse, value, fragments) -> None:
    with pytest.raises(ScenarioError) as info:
        parse(value, "two.toml: network.bandwidth")
    message = str(info.value)
    assert message.startswith("two.toml: network.bandwidth: ")
    assert "such as" in message or "too large" in message
    for fragment in fragments:
        assert fragment in message


def test_zero_is_refused_only_where_it_means_nothing() -> None:
    assert parse_rate("0 Mbit/s", allow_zero=True) == 0.0
    with pytest.raises(ScenarioError, match="positive"):
        parse_size("0 MiB", allow_zero=False)


@pytest.mark.parametrize(
    ("formatter", "value", "expected"),
    [
        (format_rate, 125e6, "1 Gbit/s"),
        (format_rate, 12.5e6, "100 Mbit/s"),
        (format_rate, 2.35e6, "18.8 Mbit/s"),
        (format_rate, 0.0, "0 bit/s"),
        (format_bytes, 4e6, "4 MB"),
        (format_bytes, 4_194_304, "4.19 MB"),
        (format_bytes, 512, "512 B"),
        (format_time, 2e-4, "200 us"),
        (format_time, 0.03, "30 ms"),
        (format_time, 90.0, "1.5 min"),
        (format_time, 7200.0, "2 h"),
        (format_time, 0.9999, "1 s"),
    ],
)
def test_formatting(formatter, value, expected) -> None:
    assert formatter(value) == expected


def test_binary_sizes_format_with_binary_prefixes() -> None:
    assert format_bytes(6 * 2**20, binary=True) == "6 MiB"


@given(st.text())
def test_any_text_is_a_quantity_or_a_scenario_error(text: str) -> None:
    for parse in (parse_rate, parse_size, parse_time):
        try:
            value = parse(text, "f.toml: x")
        except ScenarioError as err:
            assert str(err).startswith("f.toml: x: ")
        else:
            assert math.isfinite(value) and value >= 0


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.lists(st.integers()), st.binary()))
def test_non_strings_are_scenario_errors(value) -> None:
    for parse in (parse_rate, parse_size, parse_time):
        with pytest.raises(ScenarioError):
            parse(value, "x")


@example(5e-324, "b/s")  # 4b6b10e: the rate underflowed to 0 bytes/s and was called "not positive"
@given(
    st.floats(min_value=0, max_value=1e15, allow_nan=False),
    st.sampled_from(sorted({**RATE_UNITS, **SIZE_UNITS, **TIME_UNITS})),
)
def test_number_and_known_unit_scales_exactly(number: float, unit: str) -> None:
    table = RATE_UNITS if unit in RATE_UNITS else SIZE_UNITS if unit in SIZE_UNITS else TIME_UNITS
    parse = parse_rate if table is RATE_UNITS else parse_size if table is SIZE_UNITS else parse_time
    try:
        value = parse(f"{number!r} {unit}", "x")
    except ScenarioError as err:  # a rate must be at least 1 bit/s, a time at most 1e12 s
        if parse is parse_time:
            assert number * float(table[unit]) > MAX_TIME and "too long to be a time" in str(err)
            return
        assert parse is parse_rate and number * float(table[unit]) < 0.125
        assert ("must be positive" in str(err) if number == 0
                else "too small to be a rate (the least is 1 bit/s)" in str(err))
        return
    assert value == pytest.approx(number * float(table[unit]), rel=1e-15)


@given(st.floats(min_value=1e-12, max_value=1e15, allow_nan=False, allow_infinity=False))
def test_formatted_values_parse_back_to_three_digits(value: float) -> None:
    if value >= 0.125:  # 1 bit/s, the least rate
        assert parse_rate(format_rate(value)) == pytest.approx(value, rel=5e-3)
    elif value < 0.124:  # below, it is refused (between the two, rounding to three digits decides)
        with pytest.raises(ScenarioError, match="too small to be a rate"):
            parse_rate(format_rate(value))
    assert parse_size(format_bytes(value)) == pytest.approx(value, rel=5e-3)
    assert parse_size(format_bytes(value, binary=True)) == pytest.approx(value, rel=5e-3)
    if value <= 0.99 * MAX_TIME:  # rounding to three digits may carry a value near the ceiling past it
        assert parse_time(format_time(value)) == pytest.approx(value, rel=5e-3)


# rounds to 0; 1/rate overflows
@pytest.mark.parametrize("tiny", ["5e-324 b/s", "1e-320 b/s", "1e-300 b/s", "0.5 bit/s"])
def test_a_rate_below_1_bit_per_second_is_too_small(tiny):
    with pytest.raises(ScenarioError, match=rf"network.bandwidth: '{tiny}' is too small to be a rate \(the least"):
        parse_rate(tiny, "network.bandwidth")


def test_1_bit_per_second_is_a_rate_and_zero_is_not_positive():
    assert parse_rate("1 bit/s", "x") == 0.125
    with pytest.raises(ScenarioError, match=r"'0 b/s' must be positive"):
        parse_rate("0 b/s", "network.bandwidth")
    assert parse_time("5e-324 ns", "x") == 0.0  # a time may be zero: the nearest value
