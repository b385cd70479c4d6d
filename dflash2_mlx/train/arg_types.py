"""argparse types for the training modules' command lines: out-of-range values are usage
errors naming the flag (exit 2), before any model loads."""

from __future__ import annotations

import argparse
import math
from typing import Callable


def int_at_least(lo: int) -> Callable[[str], int]:
    """An argparse type: an integer >= lo."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        return value

    return parse


def float_in(lo: float, hi: float, lo_open: bool, want: str) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] ((lo, hi] when lo_open); `want` says so."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        inside = lo < value <= hi if lo_open else lo <= value <= hi  # NaN is never inside
        if not (math.isfinite(value) and inside):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        return value

    return parse
