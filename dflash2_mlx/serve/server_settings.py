"""What every request of a server runs with (a request may override sampling)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..engine.generation import block_at
from ..engine.sampling import SamplingParams
from ..settings import SamplingDefaults, block_for_temperature


@dataclass(frozen=True)
class Settings:
    model_name: str
    context: int  # prompt + max_tokens limit
    default_max_tokens: int | None  # None: what the context leaves
    block_size: int | None  # None: the drafter's trained block size
    speculative: bool
    effective_block: int  # tokens verified per round (1 when speculative is off)
    vocab: int
    sampling: SamplingDefaults = SamplingDefaults()  # for the fields a request leaves out
    lookup_block: int | None = None  # lookup / prediction rounds; None: the engine's default
    thinking_budget: int | None = None  # for requests that give none (engine/budget.py)
    block_by_context: tuple[tuple[int, int], ...] = ()  # GenerationParams.block_by_context
    # The block of sampled requests from a temperature on (settings.block_for_temperature).
    block_by_temperature: tuple[tuple[float, int], ...] = ()
    verify_cost: Callable[[int, int], float] | None = None  # GenerationParams.verify_cost
    other_names: tuple[str, ...] = ()  # what a request's `model` may also say (an alias's synonyms)

    def serves(self, name: str | None) -> bool:
        """A request's `model` names this server's model (none named: it does); case-blind,
        as the registry's aliases."""
        names = (self.model_name, *self.other_names)
        return name is None or name.lower() in {n.lower() for n in names}

    def blocks_for(self, sampling: SamplingParams) -> tuple[int | None, tuple]:
        """(block_size, block_by_context) of a request sampled with `sampling`: the server's,
        lowered for a sampled request by the profile's block_by_temperature."""
        if not (self.speculative and self.block_by_temperature):
            return self.block_size, self.block_by_context
        return block_for_temperature(
            self.effective_block,
            self.block_by_context,
            self.block_by_temperature,
            sampling.temperature,
        )

    def usage_block(self, sampling: SamplingParams, prompt_tokens: int) -> int:
        """The block a request's first drafter round verifies (usage.dflash2.block_size): at
        its temperature and prompt length; 1 when speculative is off."""
        if not self.speculative:
            return 1
        block, by_context = self.blocks_for(sampling)
        return block_at(block or self.effective_block, by_context, prompt_tokens)
