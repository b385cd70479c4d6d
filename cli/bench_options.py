"""What `dflash2 bench` was asked (its parsed options) and what a measuring mode works with.
No MLX here: `dflash2 bench --help` imports this module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .common import fail

KERNEL_REPEATS = 20  # kernel micro-benchmarks: timed runs each, unless --repeats says
AUTOTUNE_REPEATS = 5  # the autotuner's timed runs per width, unless --repeats says
# What --kernels alone (no model loaded) takes besides itself
_KERNELS_ONLY_FLAGS = {"kernels", "json_path", "repeats", "no_plot", "offline"}


@dataclass
class BenchOptions:
    """`dflash2 bench`'s options, parsed (block and concurrency lists are sorted ints)."""

    model: Optional[str]
    target: Optional[str]
    drafter: Optional[str]
    prompts: str
    limit: Optional[int]
    max_tokens: int
    repeats: int
    blocks: list[int]
    context: int
    json_path: Path
    plot: Optional[Path]
    no_plot: bool
    autotune: bool
    concurrency: list[int]
    kernels: bool
    thinking: Optional[bool]
    offline: bool
    engine_flags: Any  # common.engine_flags(...): as given
    argv: list[str]
    given: frozenset[str] = frozenset()  # the parameters the command line set

    @property
    def kernel_repeats(self) -> int:
        return self.repeats if "repeats" in self.given else KERNEL_REPEATS

    @property
    def autotune_repeats(self) -> int:
        return self.repeats if "repeats" in self.given else AUTOTUNE_REPEATS

    @property
    def kernels_only(self) -> bool:
        """--kernels alone: no model is loaded, no prompt is read."""
        return (
            self.kernels
            and not self.autotune
            and not self.concurrency
            and self.model is None
            and self.target is None
            and self.drafter is None
        )

    @property
    def plot_path(self) -> Path | None | bool:
        """False: no PNG (--no-plot); None: next to the JSON; else the --plot path."""
        return False if self.no_plot else self.plot

    @property
    def png(self) -> Path:
        """Where the plot goes when there is one: --plot, else next to the JSON."""
        return (
            Path(self.plot) if self.plot is not None else Path(self.json_path).with_suffix(".png")
        )

    def check(self) -> None:
        """Refuses contradictory or out-of-range options (one-line user errors)."""
        for flag, value, low in (
            ("--max-tokens", self.max_tokens, 2),
            ("--repeats", self.repeats, 1),
            ("--context", self.context, 1),
        ):
            if value < low:
                fail(f"{flag} must be >= {low}, got {value}")
        if self.limit is not None and self.limit < 1:
            fail(f"--limit must be >= 1, got {self.limit}")
        if self.autotune and len(self.blocks) > 1:
            fail("--autotune takes one --block (the largest block size to consider)")
        if self.concurrency and self.autotune:
            fail("--concurrency and --autotune are separate modes: give one")
        if self.concurrency and len(self.blocks) > 1:
            fail("--concurrency takes one --block (or none: the block chat and serve use)")
        if self.concurrency and self.plot is not None:
            fail("--plot needs the speed benchmark; --concurrency writes no plot")
        if self.plot is not None and self.no_plot:
            fail("--plot and --no-plot contradict each other")
        if self.plot is not None and (self.autotune or self.kernels_only):
            fail("--plot needs the speed benchmark (it plots speedup and τ per category)")
        if self.kernels_only and self.given - _KERNELS_ONLY_FLAGS:
            name = sorted(self.given - _KERNELS_ONLY_FLAGS)[0]
            flag = (
                "--thinking/--no-thinking" if name == "thinking" else "--" + name.replace("_", "-")
            )
            fail(f"{flag} needs a model run: --kernels alone times the kernels only (add a MODEL)")
        plots = not (self.no_plot or self.autotune or self.concurrency or self.kernels_only)
        if plots and self.png.resolve() == Path(self.json_path).resolve():
            fail(
                f"--json {self.json_path}: the plot would be written over it; give --plot "
                "another path (or --no-plot)"
            )
        if self.concurrency and "context" in self.given:
            fail(
                "--context sets the cache depth the speed benchmark and --autotune time at; "
                "--concurrency does not use it"
            )


@dataclass
class BenchRun:
    """A loaded pair and what every measuring mode (speed, autotune, concurrency) shares."""

    options: BenchOptions
    pair: Any  # dflash2_mlx.api.Pair
    resolved: Any  # registry.ResolvedPair: name, target, drafter
    engine: Any  # settings.EngineSettings: block rule, lookup block, width cost
    prompts: list  # the chosen prompts
    report: dict  # the JSON report, filled in by the mode
    console: Any  # rich consoles: results (stdout) and progress / notes (stderr)
    err: Any


def chosen_blocks(run: BenchRun) -> tuple[list[int], str]:
    """(the blocks to measure, why): given, else the rule chat and serve use (said when it
    clamped a recommendation); recorded in the report with the lookup block."""
    from rich.text import Text

    from dflash2_mlx.settings import BY_FLAG, BY_PROFILE

    auto, lookup_block = run.engine.block, run.engine.lookup_block
    blocks, source = run.options.blocks, BY_FLAG
    if not blocks:  # dflash2_mlx.settings
        blocks, source = [auto.size], auto.reason
        if auto.note:
            run.err.print(Text(f"note: {auto.note}", style="yellow"))
    run.report["settings"].update(
        blocks=blocks,
        block_source=source,
        lookup_block=lookup_block,
        lookup_block_source=BY_PROFILE if lookup_block else "engine default",
    )
    return blocks, source
