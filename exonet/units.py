"""Units: parse "100 Mbit/s", "4 MiB", "30 ms" into SI base units, and format them back.

Scenario files carry quantities as strings with their unit, so a reader never has
to guess whether ``bandwidth = 100`` meant bits, bytes, or megabits. Everything is
converted to SI base units (bytes/s, bytes, seconds); bit rates are divided by 8.
Prefixes k, M, G, T are decimal (1 Gbit = 1e9 bit); Ki, Mi, Gi, Ti are binary.

Arithmetic goes through :class:`decimal.Decimal`, so "200 us" is exactly the float
nearest 2e-4 and "1 Gbit/s" is exactly 125e6.
"""

from __future__ import annotations

import difflib
import math
import re
from decimal import Context, Decimal

from exonet.errors import ScenarioError

MIN_RATE = 0.125  # bytes/s, 1 bit/s: no network is slower, and the largest payload's time stays a finite tick count
MAX_TIME = 1e12  # seconds (about 31,700 years): no run lasts longer, and sums of such times stay finite ticks

_SI = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_PREFIXES = {**_SI, **_IEC}


def _rate_units() -> dict[str, Decimal]:
    """Bytes/s per unit, for every spelling of a bit or byte rate."""
    table: dict[str, Decimal] = {}
    for prefix, factor in _PREFIXES.items():
        for bit in ("bit/s", "bits/s", "bps", "b/s"):
            table[prefix + bit] = Decimal(factor) / 8
        for byte in ("B/s", "Bps"):
            table[prefix + byte] = Decimal(factor)
    table["byte/s"] = table["bytes/s"] = Decimal(1)
    return table


def _size_units() -> dict[str, Decimal]:
    """Bytes per unit."""
    table = {prefix + "B": Decimal(factor) for prefix, factor in _PREFIXES.items()}
    table["byte"] = table["bytes"] = Decimal(1)
    return table


RATE_UNITS = _rate_units()
SIZE_UNITS = _size_units()
PRICE_UNITS = {f"$/{unit}": 1 / factor for unit, factor in SIZE_UNITS.items() if unit not in ("byte", "bytes")}
TIME_UNITS = {
    "s": Decimal(1),
    "sec": Decimal(1),
    "ms": Decimal("1e-3"),
    "us": Decimal("1e-6"),
    "\u00b5s": Decimal("1e-6"),  # micro sign
    "\u03bcs": Decimal("1e-6"),  # Greek mu
    "ns": Decimal("1e-9"),
    "min": Decimal(60),
    "h": Decimal(3600),
}

_QUANTITY = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*", re.DOTALL)
_CONTEXT = Context(prec=34, traps=[])  # no traps: overflow becomes Infinity and is rejected below

_EXAMPLES = {
    "rate": '"100 Mbit/s", "1 Gbps", "10 Gb/s" or "125 MB/s"',
    "size": '"4 MB", "4 MiB" or "512 KiB"',
    "time": '"30 ms", "200 us" or "1.5 s"',
    "price": '"0.08 $/GB" or "0.02 $/GiB"',
}


def _parse(text: object, where: str, kind: str, units: dict[str, Decimal], allow_zero: bool) -> float:
    """Parse ``text`` as a number followed by one of ``units``; raise ScenarioError naming ``where``."""
    examples = _EXAMPLES[kind]
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ScenarioError(f"{where}: expected a {kind} as a string such as {examples}, got {text!r}")
    if not isinstance(text, str):
        raise ScenarioError(f"{where}: {text!r} has no unit; write a {kind} as a string such as {examples}")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ScenarioError(f"{where}: cannot read {text!r} as a {kind}; "
                            f"expected a number and a unit such as {examples}")
    number, unit = match.group(1), re.sub(r"\s+", "", match.group(2))
    if not unit:
        raise ScenarioError(f"{where}: {text!r} has no unit; write a {kind} such as {examples}")
    if unit not in units:
        hint = _suggest(unit, units)
        raise ScenarioError(f"{where}: unknown {kind} unit {unit!r} in {text!r}{hint}; "
                            f"expected a {kind} such as {examples}")
    value = float(_CONTEXT.multiply(Decimal(number), units[unit]))
    if not math.isfinite(value):
        raise ScenarioError(f"{where}: {text!r} is too large to be a {kind}")
    if kind == "time" and value > MAX_TIME:
        raise ScenarioError(f"{where}: {text!r} is too long to be a time (the most is {MAX_TIME:g} s, "
                            f"about 31,700 years); expected a time such as {examples}")
    if (value == 0 and not allow_zero and Decimal(number) > 0) or (kind == "rate" and 0 < value < MIN_RATE):
        why = "the least is 1 bit/s" if kind == "rate" else "it rounds to zero"
        raise ScenarioError(f"{where}: {text!r} is too small to be a {kind} ({why}); expected a {kind} such as "
                            f"{examples}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ScenarioError(f"{where}: {text!r} must be {bound}; expected a {kind} such as {examples}")
    return value


def _suggest(unit: str, units: dict[str, Decimal]) -> str:
    """' (did you mean ...?)' for a misspelt unit: a case-insensitive match first (also with "/s" added, so
    "mbit" suggests "Mbit/s"), then the closest spelling."""
    folded = [u for u in units if u.lower() == unit.lower()] or [u for u in units if u.lower() == f"{unit}/s".lower()]
    close = folded or difflib.get_close_matches(unit, list(units), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(u) for u in close)}?)" if close else ""


def parse_rate(text: object, where: str = "value", *, allow_zero: bool = False) -> float:
    """A bit or byte rate ("100 Mbit/s", "1 Gbps", "125 MB/s", "1 GiB/s") in bytes/s.

    Args:
        text: the quantity, a string with a unit; a bare number is an error.
        where: the file and field, for the error message (e.g. "two.toml: network.bandwidth").
        allow_zero: whether 0 is acceptable; a zero bandwidth never delivers, so by default no.
    """
    return _parse(text, where, "rate", RATE_UNITS, allow_zero)


def parse_size(text: object, where: str = "value", *, allow_zero: bool = True) -> float:
    """A size ("4 MB", "4 MiB", "512 KiB", "1 GB") in bytes."""
    return _parse(text, where, "size", SIZE_UNITS, allow_zero)


def parse_price(text: object, where: str = "value") -> float:
    """A price per amount of data ("0.08 $/GB", "0.02 $/GiB", "20 $/TB") in dollars per byte."""
    return _parse(text, where, "price", PRICE_UNITS, True)


def format_dollars(amount: float) -> str:
    """Dollars with cents, or three significant digits below a cent ("$12.40", "$0.00312")."""
    return f"${amount:,.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.3g}"


def parse_time(text: object, where: str = "value", *, allow_zero: bool = True) -> float:
    """A duration ("30 ms", "200 us", "1.5 s", "2 min", "1 h") in seconds."""
    return _parse(text, where, "time", TIME_UNITS, allow_zero)


def _scaled(value: float, steps: list[tuple[float, str]], fallback: str) -> str:
    """Three significant digits with the largest unit that keeps the number >= 1."""
    if not math.isfinite(value) or value == 0:
        return f"{value:g} {fallback}"
    chosen = steps[0]
    for factor, suffix in steps:
        if abs(value) >= factor:
            chosen = (factor, suffix)
    index = steps.index(chosen)
    text = f"{value / chosen[0]:.3g}"
    if abs(float(text)) >= 1000 and index + 1 < len(steps):  # 999.7 rounds up to the next unit
        chosen = steps[index + 1]
        text = f"{value / chosen[0]:.3g}"
    return f"{float(text):g} {chosen[1]}"


def format_rate(bytes_per_s: float) -> str:
    """A rate in bytes/s as a bit rate, the way links are sold ("1 Gbit/s")."""
    steps = [(1.0, "bit/s"), (1e3, "kbit/s"), (1e6, "Mbit/s"), (1e9, "Gbit/s"), (1e12, "Tbit/s")]
    return _scaled(bytes_per_s * 8, steps, "bit/s")


def format_bytes(nbytes: float, *, binary: bool = False) -> str:
    """A byte count with a decimal prefix ("4.19 MB"), or a binary one ("4 MiB") for buffers and windows."""
    if binary:
        steps = [(1.0, "B"), (2.0**10, "KiB"), (2.0**20, "MiB"), (2.0**30, "GiB"), (2.0**40, "TiB")]
    else:
        steps = [(1.0, "B"), (1e3, "kB"), (1e6, "MB"), (1e9, "GB"), (1e12, "TB")]
    return _scaled(float(nbytes), steps, "B")


def format_time(seconds: float) -> str:
    """A duration in the unit a person would read it in ("30 ms", "2.5 min")."""
    steps = [(1e-9, "ns"), (1e-6, "us"), (1e-3, "ms"), (1.0, "s"), (60.0, "min"), (3600.0, "h")]
    return _scaled(float(seconds), steps, "s")


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun`` in agreement: "1 node", "4 nodes" (English plurals in -s only)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
