"""Type checks for values from users, requests and files. Python's bool is an int, but True is
never a count, an id or a temperature; these say so in one place."""

from __future__ import annotations


def is_int(value, low: int | None = None) -> bool:
    """An int that is not a bool, and >= `low` when given."""
    return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


def is_number(value) -> bool:
    """An int or a float that is not a bool (NaN included: callers check ranges)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
