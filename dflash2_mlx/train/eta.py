"""The remaining time of a long `dflash2 train` stage at its rate so far, for its log lines."""

from __future__ import annotations


def clock(seconds: float) -> str:
    """1:05 or 1:02:05."""
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def remaining(elapsed: float, done: float, left: float) -> str:
    """'~M:SS left' for `left` more of what took `elapsed` seconds for `done` (steps, prompts,
    tokens: one unit); '' before anything is done."""
    return f"~{clock(elapsed / done * left)} left" if done > 0 else ""
