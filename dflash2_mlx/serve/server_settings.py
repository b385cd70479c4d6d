"""What every request of a server runs with (a request may override sampling)."""

from __future__ import annotations

from dataclasses import dataclass

from ..sampling import SamplingParams
from ..settings import Drafting, SamplingDefaults


MLX_LM_DEFAULT_MODEL = "default_model"  # what mlx_lm.server calls the model it loaded


@dataclass(frozen=True)
class ServerSettings:
    model_name: str
    context: int  # prompt + max_tokens limit
    default_max_tokens: int | None  # None: what the context leaves
    drafting: Drafting  # every request's (its temperature may lower the block)
    trained: int  # the drafter's trained block size (Drafting.block None: this one)
    vocab: int
    sampling: SamplingDefaults = SamplingDefaults()  # for the fields a request leaves out
    thinking_budget: int | None = None  # for requests that give none (engine/budget.py)
    other_names: tuple[str, ...] = ()  # what a request's `model` may also say (an alias's synonyms)

    @property
    def speculative(self) -> bool:
        return self.drafting.speculative

    @property
    def effective_block(self) -> int:
        """Tokens a greedy drafter round verifies at the start of a reply (1 when speculative
        is off): the server's block before any schedule by context or temperature."""
        return self.drafting.block_now(0.0, 0, self.trained)

    def drafting_fields(self, sampling: SamplingParams) -> dict:
        """GenerationParams' drafting fields of a request sampled with `sampling`."""
        return self.drafting.fields(sampling.temperature, self.trained)

    def usage_block(self, sampling: SamplingParams, prompt_tokens: int) -> int:
        """The block a request's first drafter round verifies (usage.dflash2.block_size): at
        its temperature and prompt length; 1 when speculative is off."""
        return self.drafting.block_now(sampling.temperature, prompt_tokens, self.trained)

    def serves(self, name: str | None) -> bool:
        """A request's `model` names this server's model (none named, or mlx_lm.server's
        "default_model": it does); case-blind, as the registry's aliases."""
        names = (self.model_name, *self.other_names, MLX_LM_DEFAULT_MODEL)
        return name is None or name.lower() in {n.lower() for n in names}
