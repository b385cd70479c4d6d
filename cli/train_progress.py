"""`dflash2 train`'s progress: a bar on a terminal, log lines with elapsed and remaining
time elsewhere."""

from __future__ import annotations

import time


def training_progress(console, steps: int):
    """A progress bar (loss, tokens/s, ETA) on a terminal; a line every 10 steps in a log.
    Held-out τ evaluations are always printed as lines."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )
    task: dict = {}

    def on_step(rec: dict):
        step = rec["step"]
        if task.get("last", step) >= step:  # first step, or the next ablation variant's run
            task["id"] = progress.add_task("train", total=steps, completed=step - 1, stats="")
            task["t0"], task["first"], task["total"] = time.monotonic(), step - 1, steps
        task["last"] = step
        stats = f"loss {rec['loss']:.3f}  lr {rec['lr']:.2e}  {rec['tok_s']:.0f} tok/s"
        progress.update(task["id"], completed=step, stats=stats)
        if "proxy_tau" in rec or (not console.is_terminal and step % 10 == 0):
            extra = (
                f"  τ(held-out) {rec['proxy_tau']:.3f}  τ(train) {rec['train_tau']:.3f}"
                if "proxy_tau" in rec
                else ""
            )
            progress.console.print(f"step {step:>6}/{steps}  {stats}{extra}{_times(task, step)}")

    return progress, on_step


def _times(task: dict, step: int) -> str:
    """Elapsed and remaining time of a log line (a terminal's bar shows its own)."""
    from dflash2_mlx.train.eta import clock, remaining

    elapsed = time.monotonic() - task["t0"]
    left = remaining(elapsed, step - task["first"], task["total"] - step) or "~0:00 left"
    return f"  {clock(elapsed)} elapsed, {left}"
