"""The machine's load around a benchmark's measurement: recorded in its report, and said when
other work shared the machine (dflash2_mlx.bench_env.busy_note)."""

from __future__ import annotations

from .bench_options import BenchRun


def watch_load(run: BenchRun):
    """Start watching the machine's load for a measurement; the returned function, called when
    it ends, records the load before and over its last minute in the report and returns what
    to say if other work shared the machine (bench_env.busy_note), else None."""
    from dflash2_mlx import bench_env as E

    before, since = E.machine_load(), E.cpu_clock()

    def measured(effect: str = E.SPEED_BUSY) -> str | None:
        after = E.machine_load(since)
        run.report["machine_load"] = {"before": before, "after": after}
        return E.busy_note(after, effect=effect)  # before: the last run's load, not this one's

    return measured


def say_busy(run: BenchRun, note: str | None) -> None:
    if note:
        run.err.print(  # one line, whole: a piped log is grepped for it
            f"note: {note}", style="yellow", markup=False, highlight=False, soft_wrap=True
        )
