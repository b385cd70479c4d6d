"""One generation's parameters and running state, and the rules every round applies to it:
what it commits (`cut`: max tokens, stop tokens, its constraint) and how its verify logits
are shaped (`shape_logits`: logits processors, then the constraint's mask). Used alike by the
single-sequence loop (loop.py) and the batched one (batch.py).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable, Sequence

import mlx.core as mx

from ..errors import ParameterError
from .constraint import ConstraintFactory, TokenConstraint, constrain, ended
from .logprobs import check_top, token_logprobs
from .processors import LogitsProcessor, process
from .proposal import Proposal
from ..sampling import SamplingParams, plain_number
from .width import WidthRule, cut_to_rate
from ..values import is_int, is_number


@dataclass(frozen=True)
class GenerationParams:
    """How one generation runs: `max_tokens`, `sampling` (SamplingParams), the drafter's
    `block_size` (None: its trained one; through a Pair, `pair.drafting`'s) or `speculative=False` (plain decoding), extra
    `stop_token_ids`, a `prediction` of the answer's tokens, a JSON-schema `constraint`,
    `logits_processors` (penalties), `logprobs` (alternatives per token, 0-20), and the
    autotuner's `lookup_block` / `block_by_context` / `verify_cost`. The output is plain
    decoding's with the same sampler, processors and constraint whatever the drafting fields
    say; each field's comment below says what it does."""

    max_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    block_size: int | None = None  # None: the trained block (through a Pair: pair.drafting's)
    speculative: bool = True  # False = plain decoding with the same sampler
    # True: drafter rounds verify the anchor alone while the drafter's drafts seldom pass
    # (BACKOFF_*); False: every drafter round drafts its block (what measuring a block needs:
    # the autotuner, `dflash2 evaluate`). The output never depends on it beyond its draws.
    backoff: bool = True
    stop_token_ids: frozenset[int] = frozenset()
    # A guess of the answer's tokens (OpenAI's Predicted Outputs): drafted from where the
    # answer follows it; never changes the output.
    prediction: tuple[int, ...] = ()
    # Tokens verified in a round drafted by context lookup or the prediction (anchor included;
    # they cost no draft pass, so they may pass the drafter's block). None: DEFAULT_LOOKUP_BLOCK.
    lookup_block: int | None = None
    # ((context, block), ...), contexts ascending: from a context (prompt + answer so far) of
    # that many tokens on, drafter rounds verify `block` tokens instead of block_size (the
    # autotuner's schedule: a verify's cost per extra token grows with the context). As with
    # block_size, greedy output never changes and sampled output keeps its distribution (a
    # seeded sample's draws follow the blocks, as they follow block_size).
    block_by_context: tuple[tuple[int, int], ...] = ()
    # ms of one sequence's verify of `width` tokens at `context` tokens, cost(context, width)
    # (the autotune profile's: batch_costs.context_costs). From block_by_context's first
    # context on, a greedy single-sequence round's lookup, prediction or datastore proposal is
    # cut to the width its source's acceptance in this generation so far pays for (a drafter
    # round instead where that is none; engine/width.py). None: never. Needs block_by_context.
    verify_cost: Callable[[int, int], float] | None = None
    # Which tokens may come next (a JSON schema: grammar.py); called once per generation.
    # The output is then what plain decoding over the masked logits gives (engine/constraint.py).
    constraint: ConstraintFactory | None = None
    # mlx-lm logits processors (penalties, logit bias: processors.penalties), applied at every
    # verified position with the tokens before it, as plain decoding applies them.
    logits_processors: tuple[LogitsProcessor, ...] = ()
    # Each committed token's log-probability and this many most likely alternatives (None:
    # none), read off the verify rows (engine/logprobs.py) and carried by RoundEvent.logprobs.
    logprobs: int | None = None
    # The prompt's own log-probabilities, each token's after the ones before it, with this
    # many alternatives (None: not asked): read off the prefill's rows, which then reads the
    # whole prompt (a session's cached prefix is fed again), on the prefill event.
    prompt_logprobs: int | None = None

    def __post_init__(self):
        for name in ("max_tokens", "block_size", "lookup_block", "logprobs", "prompt_logprobs"):
            object.__setattr__(self, name, plain_number(getattr(self, name)))
        if isinstance(self.logits_processors, list):  # mlx-lm's make_logits_processors
            object.__setattr__(self, "logits_processors", tuple(self.logits_processors))
        object.__setattr__(self, "prediction", tuple(token_ids(self.prediction, "prediction")))
        stops = frozenset(token_ids(self.stop_token_ids, "stop_token_ids"))
        object.__setattr__(self, "stop_token_ids", stops)
        if not isinstance(self.sampling, SamplingParams):
            raise ParameterError(
                f"sampling must be a SamplingParams, got {type(self.sampling).__name__}"
            )
        for name in ("speculative", "backoff"):
            if not isinstance(getattr(self, name), bool):
                raise ParameterError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 1
        ):
            raise ParameterError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.verify_cost is not None:
            check_cost(self.verify_cost)
        if self.verify_cost is not None and self.speculative and not self.block_by_context:
            raise ParameterError(
                "verify_cost applies from block_by_context's first context on: give that too"
            )
        if self.constraint is not None and not callable(self.constraint):
            raise ParameterError(
                "constraint must be a callable (e.g. pair.json_schema(...)), got "
                f"{type(self.constraint).__name__}"
            )
        if not isinstance(self.logits_processors, tuple) or not all(
            callable(p) for p in self.logits_processors
        ):
            raise ParameterError("logits_processors must be a tuple or list of callables")
        check_top(self.logprobs)
        check_top(self.prompt_logprobs, "prompt_logprobs")
        object.__setattr__(self, "block_by_context", check_block_by_context(self.block_by_context))
        for name in ("block_size", "lookup_block"):
            value = getattr(self, name)
            if value is not None and not is_int(value, 1):
                raise ParameterError(f"{name} must be an int >= 1, got {value!r}")
        if not self.speculative:  # plain decoding drafts nothing: these would be ignored
            for name in (
                "block_size",
                "lookup_block",
                "prediction",
                "block_by_context",
                "verify_cost",
            ):
                if getattr(self, name):
                    raise ParameterError(
                        f"{name} has no effect with speculative=False (plain decoding drafts "
                        "nothing): leave it unset"
                    )


def check_cost(cost) -> None:
    """GenerationParams.verify_cost: called once, as the engine calls it (context, width) ->
    ms, so a callable of another shape is refused here, not in the middle of a reply."""
    if not callable(cost):
        raise ParameterError(f"verify_cost must be a callable or None, got {cost!r}")
    try:
        ms = plain_number(cost(1, 1))
    except Exception as exc:  # noqa: BLE001 - the caller's function: its failure, named
        raise ParameterError(
            f"verify_cost must take (context, width) and return ms: verify_cost(1, 1) raised "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not is_number(ms) or not ms >= 0:
        raise ParameterError(f"verify_cost(context, width) must return ms >= 0, got {ms!r}")


def check_block_by_context(pairs) -> tuple[tuple[int, int], ...]:
    """GenerationParams.block_by_context checked: (context, block) pairs of ints >= 1, the
    contexts strictly ascending."""
    return _schedule(pairs, "block_by_context", "context", "int >= 1", lambda c: is_int(c, 1))


def check_block_by_temperature(pairs) -> tuple[tuple[float, int], ...]:
    """A front end's block_by_temperature (settings.block_for_temperature) checked:
    (temperature, block) pairs, temperatures > 0 strictly ascending, blocks ints >= 1."""
    out = _schedule(
        pairs, "block_by_temperature", "temperature", "number > 0", lambda t: is_number(t) and t > 0
    )
    return tuple((float(t), b) for t, b in out)


def _schedule(pairs, what: str, key: str, kind: str, key_ok) -> tuple:
    """(key, block) pairs: keys that `key_ok` accepts, strictly ascending; blocks ints >= 1."""
    try:
        out = tuple((plain_number(k), plain_number(b)) for k, b in pairs)
    except (TypeError, ValueError):
        raise ParameterError(f"{what} must be ({key}, block) pairs, got {pairs!r}") from None
    for k, b in out:
        if not key_ok(k) or not is_int(b, 1):
            raise ParameterError(f"{what}: {(k, b)!r} is not a {key} ({kind}) and a block >= 1")
    if any(a[0] >= b[0] for a, b in zip(out, out[1:])):
        raise ParameterError(f"{what}: the {key}s must be strictly ascending, got {out!r}")
    return out


def token_ids(tokens, what: str = "the prompt", vocab: int | None = None) -> list[int]:
    """`tokens` (any iterable of ints, e.g. a NumPy or MLX array) as a list of ids >= 0 (and
    < `vocab` when given), or a ParameterError naming the first bad one."""
    if isinstance(tokens, (str, bytes)):
        raise ParameterError(f"{what} must be token ids, not text: tokenize it first")
    if hasattr(tokens, "tolist"):  # an array
        tokens = tokens.tolist()
    try:
        items = list(tokens)
    except TypeError:
        raise ParameterError(
            f"{what} must be a sequence of token ids, got {type(tokens).__name__}"
        ) from None
    ids = []
    for i, t in enumerate(items):
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))
        except TypeError:
            raise ParameterError(f"{what}[{i}] = {t!r} is not a token id (an int)") from None
        if vocab is not None and not 0 <= ids[-1] < vocab:
            raise ParameterError(f"{what}[{i}] = {ids[-1]} is outside the vocabulary [0, {vocab})")
        if ids[-1] < 0:
            raise ParameterError(f"{what}[{i}] = {ids[-1]} is not a token id (ids are >= 0)")
    return ids


def block_at(block: int, by_context: Sequence[tuple[int, int]], context: int) -> int:
    """The block at `context` tokens: `block`, or by_context's from the last of its contexts
    that `context` has reached."""
    for start, b in by_context:
        if context < start:
            break
        block = b
    return block


# A drafter whose drafts are seldom accepted costs more than it brings (sampling at T 1.5: 6 of
# 120 drafts accepted, 0.85-0.94x plain decoding on an Intel Xeon, where a round of block 4
# costs ~1.4x a token's): after BACKOFF_AFTER of its rounds, below BACKOFF_RATE (each draft's
# acceptance, width.WidthRule.rate: ~0.24 is where block 2 breaks even there) a drafter round
# verifies its anchor alone, and every PROBE_EVERY-th such round drafts again to look.
BACKOFF_AFTER = 8
BACKOFF_RATE = 0.2
PROBE_EVERY = 8


@dataclass
class _Run:
    """One generation: its resolved limits, random key and progress."""

    params: GenerationParams
    block: int  # tokens verified in a drafter round (1: the drafter is not run)
    lookup_block: int  # tokens verified in a lookup or prediction round (1: none)
    key: mx.array
    constraint: TokenConstraint | None = None  # this generation's own (GenerationParams')
    produced: int = 0  # tokens committed so far
    rates: WidthRule = field(default_factory=WidthRule)  # its acceptance by source so far
    drafter_rounds: int = 0  # rounds that verified the drafter's drafts
    since_drafted: int = 0  # rounds since the last of them

    @property
    def room(self) -> int:
        """Tokens this generation may still commit."""
        return self.params.max_tokens - self.produced

    def block_at(self, context: int) -> int:
        """Tokens a drafter round verifies at `context` tokens (GenerationParams.
        block_by_context, else `block`)."""
        return block_at(self.block, self.params.block_by_context, context)

    def drafter_span(self, context: int) -> int:
        """Tokens a drafter round verifies now (anchor included; < 2: none drafted): the
        block at `context`, but the anchor alone while the drafter's drafts do not pay
        (BACKOFF_RATE), but for a probe every PROBE_EVERY rounds. Its acceptance alone decides
        it, so a request backs off alike alone and in a batch."""
        length = self.span(self.block_at(context))
        if length < 2 or not self.params.backoff or self.drafter_rounds < BACKOFF_AFTER:
            return length
        if self.rates.rate("drafter") >= BACKOFF_RATE or self.since_drafted + 1 >= PROBE_EVERY:
            return length
        return 1

    def observe(self, source: str, drafted: int, accepted: int) -> None:
        """A round's outcome: `drafted` drafts from `source`, `accepted` of them."""
        self.rates.observe(source, drafted, accepted)
        if source == "drafter" and drafted:
            self.drafter_rounds, self.since_drafted = self.drafter_rounds + 1, 0
        else:
            self.since_drafted += 1

    def span(self, tokens: int) -> int:
        """Tokens a round may verify, of `tokens` (anchor included): greedy, at most the room
        left (the output does not depend on it); sampled, all of them, so the rounds and their
        random draws never depend on max_tokens — a seeded reply's first N tokens are the same
        whatever max_tokens (the commit is cut at it)."""
        return min(tokens, self.room) if self.params.sampling.greedy else tokens

    def cut_model_free(self, p: Proposal, context: int) -> Proposal:
        """A greedy round's lookup, prediction or datastore proposal cut as its source's
        acceptance so far pays for, from block_by_context's first context on (where the
        profile found a verify's extra tokens dear enough to lower the drafter's block;
        GenerationParams.verify_cost). The output never depends on it."""
        cost, schedule = self.params.verify_cost, self.params.block_by_context
        if cost is None or not schedule or context < schedule[0][0] or p.source == "grammar":
            return p
        if not self.params.sampling.greedy:  # its draws would follow the cut
            return p
        return cut_to_rate(p, self.rates.rate(p.source), lambda width: cost(context, width))

    def logprobs(self, logits: mx.array, commit: list[int]) -> tuple:
        """The committed tokens' TokenLogprobs from their rows of `logits` (when asked for)."""
        top = self.params.logprobs
        return () if top is None else token_logprobs(logits, commit, top)

    def length_finish(self) -> str | None:
        return "length" if self.produced >= self.params.max_tokens else None


def cut(run: _Run, tokens: list[int]) -> tuple[list[int], str | None]:
    """The accepted tokens this generation commits (cut at its max tokens and after a stop
    token) and its finish reason (None: it goes on). Its constraint follows them."""
    commit = tokens[: run.room]
    hit = next((i for i, t in enumerate(commit) if t in run.params.stop_token_ids), None)
    if hit is not None:
        commit = commit[: hit + 1]
    run.produced += len(commit)
    if run.constraint is not None:  # a stop token ends the generation: no state after it
        run.constraint.commit(commit if hit is None else commit[:hit])
        if hit is not None:
            ended(run.constraint)
    return commit, "stop" if hit is not None else run.length_finish()


def shape_logits(
    logits: mx.array, run: _Run, history: Sequence[int], drafts: Sequence[int] = ()
) -> mx.array:
    """A round's verify logits [len(drafts) + 1, V] as plain decoding would see them: the
    generation's logits processors, then its constraint's mask, each row after its prefix."""
    logits = process(logits, run.params.logits_processors, history, drafts)
    return constrain(logits, run.constraint, drafts)
