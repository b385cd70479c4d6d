"""The block-size rules every front end shares: why a block was chosen (`BlockChoice`,
`choose_block`), where the autotune profile lowers it (by context, by temperature), and
`Drafting`, which turns them into a generation's drafting fields. Resolved by settings.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .engine.generation import block_at
from .errors import ParameterError
from .values import is_int

# Why a block size was chosen (bench writes these into its JSON as `block_source`).
BY_FLAG = "--block"
BY_PROFILE = "autotune profile"
BY_ALIAS = "alias recommendation"
BY_TRAINED = "drafter's trained block"
BY_QUANT_CAP = "quantized target's cap"


# ----------------------------------------------------------------------------- block size
def check_block(value, trained: int | None = None, flag: str = "--block") -> int:
    """`value` if it is a usable block size, else a ParameterError naming `flag`: an int >= 1,
    and at most the drafter's trained block size when that is known."""
    if not is_int(value, 1):
        raise ParameterError(f"{flag}: block_size must be an int >= 1, got {value!r}")
    if trained is not None and value > trained:
        raise ParameterError(
            f"{flag} must be 1 .. {trained}: {value} exceeds the drafter's "
            f"trained block size {trained}"
        )
    return value


# Blocks a quantized target verifies at most until a profile measures them: a quantized
# matmul's cost grows fast with the rows verified on MLX (the autotuner caps its choice here too).
QUANT_CAP = 5


@dataclass(frozen=True)
class BlockChoice:
    """Tokens verified per round, and why."""

    size: int
    trained: int  # the drafter's trained block size
    reason: str  # BY_FLAG, BY_PROFILE, BY_ALIAS, BY_TRAINED or BY_QUANT_CAP
    clamped_from: int | None = None  # a recommendation above the trained size
    # The smaller blocks the profile chose for longer contexts (GenerationParams.
    # block_by_context) and for sampling at higher temperatures (block_for_temperature): only
    # with the profile's own block, never with --block or an alias's.
    by_context: tuple[tuple[int, int], ...] = ()
    by_temperature: tuple[tuple[float, int], ...] = ()
    ignored_profile: str | None = None  # why a stored profile was not read (a damaged file)
    advice: str | None = None  # what to measure before trusting a recommendation here

    @property
    def note(self) -> str | None:
        """Said to the user when a recommendation was clamped, a profile ignored, or where a
        recommendation may not hold (`advice`)."""
        if self.clamped_from is None:
            return self.ignored_profile or self.advice
        return (
            f"the {self.reason} (block {self.clamped_from}) exceeds the drafter's trained "
            f"block size {self.trained}: using {self.trained}"
        )

    def describe(self) -> str:
        """E.g. 'block 4 (autotune profile, trained 8; 2 from 1,536 tokens; 2 from temperature
        1)'."""
        return f"block {self.size} ({self.reason}, trained {self.trained}{self.falls()})"

    def falls(self) -> str:
        """Where the block falls: '; 2 from 1,536 tokens; 2 from temperature 1' (or '')."""
        return "".join(f"; {b} from {c:,} tokens" for c, b in self.by_context) + "".join(
            f"; {b} from temperature {t:g}" for t, b in self.by_temperature
        )


def block_for_temperature(
    block: int,
    by_context: tuple[tuple[int, int], ...],
    by_temperature: tuple[tuple[float, int], ...],
    temperature: float,
) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(block, block_by_context) for a generation at `temperature`: the block of the last of
    `by_temperature`'s temperatures it has reached (greedy: none), else `block`; the context
    schedule keeps only the blocks below it. Sampled rounds accept less, so a smaller block
    may pay (calibration.py); greedy output never depends on the block, and sampled output
    keeps its distribution at any block."""
    lowered = block
    for start, b in by_temperature:
        if temperature < start:
            break
        lowered = min(lowered, b)
    if lowered == block:
        return block, by_context
    return lowered, tuple((c, b) for c, b in by_context if b < lowered)


@dataclass(frozen=True)
class Drafting:
    """How a front end's generations draft, and the one rule (`fields`) that turns it into a
    generation's drafting fields: chat and serve share it (bench sets its blocks per run). `block` None: the drafter's
    trained block (`trained`, which `at` needs only then)."""

    speculative: bool = True
    block: int | None = None
    by_context: tuple[tuple[int, int], ...] = ()  # GenerationParams.block_by_context
    by_temperature: tuple[tuple[float, int], ...] = ()  # block_for_temperature
    lookup_block: int | None = None  # GenerationParams.lookup_block
    verify_cost: Callable[[int, int], float] | None = None  # GenerationParams.verify_cost

    @classmethod
    def of(cls, speculative: bool, block: BlockChoice, lookup_block=None, verify_cost=None):
        """A front end's drafting at `block` (a BlockChoice); nothing but the switch when
        speculation is off (plain decoding would refuse the rest). The verify cost applies
        from the block's context schedule on: none without one (--block, or a profile whose
        block never falls), as GenerationParams requires."""
        if not speculative:
            return cls(False)
        cost = verify_cost if block.by_context else None
        return cls(True, block.size, block.by_context, block.by_temperature, lookup_block, cost)

    def at(self, temperature: float, trained: int | None = None) -> tuple[int | None, tuple]:
        """(block, block_by_context) of a generation at `temperature` (block_for_temperature)."""
        if not (self.speculative and self.by_temperature):
            return self.block, self.by_context
        return block_for_temperature(
            self.block or trained, self.by_context, self.by_temperature, temperature
        )

    def fields(self, temperature: float, trained: int | None = None) -> dict:
        """GenerationParams' drafting fields for a generation sampled at `temperature`."""
        if not self.speculative:
            return {"speculative": False}
        block, by_context = self.at(temperature, trained)
        return {
            "speculative": True,
            "block_size": block,
            "block_by_context": by_context,
            "lookup_block": self.lookup_block,
            # it applies from the schedule's first context on: nothing to apply without one
            "verify_cost": self.verify_cost if by_context else None,
        }

    def block_now(self, temperature: float, context: int, trained: int) -> int:
        """The block a drafter round verifies at `context` tokens (1: speculation off)."""
        if not self.speculative:
            return 1
        block, by_context = self.at(temperature, trained)
        return block_at(block or trained, by_context, context)


def check_falling(first: int, pairs, what: str) -> None:
    """A schedule's blocks must fall from `first` (each below the one before), or no entry
    could ever apply: a ParameterError naming `what`."""
    blocks = [first] + [b for _, b in pairs]
    if not all(a > b for a, b in zip(blocks, blocks[1:])):
        raise ParameterError(
            f"{what}: the blocks must fall from the block ({first}), each below the one before; "
            f"got {[list(p) for p in pairs]}"
        )


def choose_block(
    trained: int,
    *,
    flag: int | None = None,
    profile: int | None = None,
    alias: int | None = None,
    by_context: tuple[tuple[int, int], ...] = (),
    by_temperature: tuple[tuple[float, int], ...] = (),
    ignored_profile: str | None = None,
) -> BlockChoice:
    """The block rule: the flag, the autotune profile (with its blocks `by_context` and
    `by_temperature`), the alias's recommendation, the drafter's trained size; clamped to the
    trained size (a flag above it is an error). `ignored_profile`: why a stored profile could
    not be read (said in the note)."""
    if flag is not None:
        return BlockChoice(check_block(flag, trained), trained, BY_FLAG)
    for value, reason in ((profile, BY_PROFILE), (alias, BY_ALIAS)):
        if value:
            if value > trained:
                return BlockChoice(trained, trained, reason, clamped_from=value)
            if reason != BY_PROFILE:
                return BlockChoice(value, trained, reason, ignored_profile=ignored_profile)
            return BlockChoice(
                value, trained, reason, None, by_context, by_temperature, ignored_profile
            )
    return BlockChoice(trained, trained, BY_TRAINED, ignored_profile=ignored_profile)
