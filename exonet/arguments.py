"""Argument checks shared by fit, the strategies and the runtime: errors that name the argument.

They live here, below both the runtime and the strategies, so either can use them without
depending on the other; ``exonet.strategies.base`` re-exports them for strategy authors.
"""

from __future__ import annotations

import math
import warnings
from typing import Any


def check_range(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                low_open: bool = False, integer: bool = False) -> None:
    """Raise ValueError/TypeError naming ``name`` unless ``value`` is a number within the bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise TypeError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value!r}")


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """``value``, after a TypeError naming ``name`` unless it is an integer (not a bool) and a ValueError unless it
    is within [low, high]: the one integer check of fit, the strategies and the runtime."""
    check_range(name, value, low=low, high=high, integer=True)
    return value


def one_of(**spellings: Any) -> Any:
    """The value of an argument accepted under several names (seed-gym aliases); None when none is given.

    Raises:
        TypeError: more than one spelling was given, naming them.
    """
    given = [name for name, value in spellings.items() if value is not None]
    if len(given) > 1:
        raise TypeError(f"{' and '.join(given)} are aliases of one argument; pass only one of them")
    return spellings[given[0]] if given else None


def renamed(who: str, new: str, value: Any, old: str, old_value: Any) -> Any:
    """``new``'s value, taking the deprecated spelling ``old`` with a DeprecationWarning naming ``new``.

    Raises:
        TypeError: both spellings were given, or neither (the argument is required), naming them.
    """
    if old_value is not None:
        if value is not None:
            raise TypeError(f"{who}: {old} is the old spelling of {new}; pass only {new}")
        warnings.warn(f"{who}: {old}= is deprecated, use {new}=", DeprecationWarning, stacklevel=3)
        return old_value
    if value is None:
        raise TypeError(f"{who}: missing required keyword argument {new!r}")
    return value
