"""The units of scenario files, re-exported from ``exonet.units`` (their home below every package that uses them)."""

from exonet.units import (
    MIN_RATE,
    PRICE_UNITS,
    RATE_UNITS,
    SIZE_UNITS,
    TIME_UNITS,
    format_bytes,
    format_dollars,
    format_rate,
    format_time,
    parse_price,
    parse_rate,
    parse_size,
    parse_time,
)

__all__ = ["MIN_RATE", "PRICE_UNITS", "RATE_UNITS", "SIZE_UNITS", "TIME_UNITS", "format_bytes", "format_dollars",
           "format_rate", "format_time", "parse_price", "parse_rate", "parse_size", "parse_time"]
