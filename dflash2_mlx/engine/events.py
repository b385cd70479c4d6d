"""Per-round events and running statistics, shown live by the CLI, server and benchmarks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, get_args


# Where a round's drafts came from: the drafter's pass (also a round that drafted nothing),
# context lookup (engine/lookup.py), the request's predicted output, the response datastore
# (engine/datastore.py), or the text a constraint forces (engine/constraint.py).
DraftSource = Literal["drafter", "lookup", "prediction", "datastore", "grammar"]
SOURCES: tuple[str, ...] = get_args(DraftSource)


@dataclass(frozen=True, kw_only=True)
class RoundEvent:
    """What one round committed (or the prefill's first token: `prefill` true) and how: drafts
    proposed and accepted, its `source`, its times; each field's comment below says more."""

    tokens: list[int]  # committed this round (drafts accepted + bonus; the first event: 1 token)
    drafted: int = 0  # draft tokens proposed (0 for the prefill token or plain decoding)
    accepted: int = 0  # of those, accepted by the target
    block_size: int = 1  # tokens verified this round: anchor + drafted
    # proposing (a drafter's pass is issued here and runs while the verify's graph is built;
    # what is left of it is waited for within verify_ms)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    # batched engine: time since this request's last event spent on others' work (a joining
    # request's prefill chunks), so draft + verify + wait is the wall time it waited
    wait_ms: float = 0.0
    prefill_ms: float = 0.0  # the prompt's prefill, on the prefill event
    finish_reason: str | None = None  # None while going on; "stop" | "length" | "error"
    prefill: bool = False  # the event that carries the first token after prefill
    prompt_tokens: int = 0  # tokens actually prefilled (after cache reuse), on the prefill event
    reused_tokens: int = 0  # prompt tokens served from the session cache
    source: DraftSource = "drafter"
    batch_size: int = 1  # requests in the verify forward of this round (engine/batch.py)
    queue_ms: float = 0.0  # on the prefill event: waited from `add` to the prefill's start
    prediction_tokens: int = 0  # on the prefill event: the request's prediction's length
    prediction_used: int = 0  # of the prediction's tokens, those this event's tokens followed
    # with GenerationParams.logprobs: one engine.logprobs.TokenLogprob per token in `tokens`
    logprobs: tuple = ()
    # on the prefill event, with GenerationParams.prompt_logprobs: one TokenLogprob per prompt
    # token after the first (each scored after the ones before it)
    prompt_logprobs: tuple | None = None
    # finish_reason "error" (the batched engine): why this request left (its prefill, or its
    # own processor / grammar / logprobs raised in a round); the others go on
    error: Exception | None = None

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"RoundEvent.source must be one of {SOURCES}, got {self.source!r}")


@dataclass
class GenerationStats:
    """Running totals over a generation (or a whole chat session)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    wait_ms: float = 0.0  # between its rounds, on others' work (batched engine)
    prefill_ms: float = 0.0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    histogram: Counter = field(default_factory=Counter)  # tokens committed per round -> rounds
    last_round: int = 0
    lookup_rounds: int = 0  # rounds whose drafts came from context lookup
    lookup_drafted: int = 0  # draft tokens proposed by context lookup
    lookup_accepted: int = 0  # of those, accepted
    longest_round: int = 0  # most tokens verified in one round (lookup rounds may pass the block)
    prediction_drafted: int = 0  # draft tokens taken from the request's prediction
    prediction_accepted: int = 0  # of those, accepted
    prediction_tokens: int = 0  # the prediction's length
    prediction_used: int = 0  # its tokens the answer followed (appeared in the completion)
    queue_ms: float = 0.0  # waited before the prefill (batched engine, server)
    batch_rows: int = 0  # rows of the verify forwards of its rounds, summed
    max_batch_size: int = 0  # most rows in one of its rounds
    datastore_rounds: int = 0  # rounds whose drafts came from the response datastore
    datastore_drafted: int = 0  # draft tokens proposed by the datastore
    datastore_accepted: int = 0  # of those, accepted
    grammar_rounds: int = 0  # rounds whose drafts were the text a constraint forces

    def add(self, ev: RoundEvent) -> None:
        if ev.error is not None:  # a failed request's last event: no round ran
            return
        self.prediction_tokens += ev.prediction_tokens
        self.prediction_used += ev.prediction_used
        if ev.prefill:
            self.queue_ms += ev.queue_ms
            self.prefill_ms += ev.prefill_ms
            self.prompt_tokens += ev.prompt_tokens
            self.reused_tokens += ev.reused_tokens
            self.committed += len(ev.tokens)
            return
        self.rounds += 1
        self.drafted += ev.drafted
        self.accepted += ev.accepted
        self.committed += len(ev.tokens)
        self.draft_ms += ev.draft_ms
        self.verify_ms += ev.verify_ms
        self.wait_ms += ev.wait_ms
        self.histogram[ev.accepted + 1] += 1
        self.last_round = ev.accepted + 1
        self.longest_round = max(self.longest_round, ev.block_size)
        self.batch_rows += ev.batch_size
        self.max_batch_size = max(self.max_batch_size, ev.batch_size)
        if ev.source == "lookup":
            self.lookup_rounds += 1
            self.lookup_drafted += ev.drafted
            self.lookup_accepted += ev.accepted
        elif ev.source == "prediction":
            self.prediction_drafted += ev.drafted
            self.prediction_accepted += ev.accepted
        elif ev.source == "grammar":
            self.grammar_rounds += 1
        elif ev.source == "datastore":
            self.datastore_rounds += 1
            self.datastore_drafted += ev.drafted
            self.datastore_accepted += ev.accepted

    @property
    def tau(self) -> float:
        """Mean acceptance length per round, bonus token included (1 .. block size)."""
        return tau(self.accepted, self.rounds)

    @property
    def lookup_tau(self) -> float:
        """τ of the context-lookup rounds alone (0 when none)."""
        n = self.lookup_rounds
        return (self.lookup_accepted + n) / n if n else 0.0

    @property
    def mean_batch_size(self) -> float:
        """Mean rows verified together in its rounds (1.0 alone; 0.0 before any round)."""
        return self.batch_rows / self.rounds if self.rounds else 0.0

    @property
    def datastore_tau(self) -> float:
        """τ of the datastore rounds alone (0 when none)."""
        return tau(self.datastore_accepted, self.datastore_rounds)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def decode_ms(self) -> float:
        """Time after the first token: its rounds, and the waits between them."""
        return self.draft_ms + self.verify_ms + self.wait_ms

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first token (rounds only)."""
        n = self.committed - (1 if self.prefill_ms or self.prompt_tokens else 0)
        return 1000.0 * n / self.decode_ms if self.decode_ms > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "committed": self.committed,
            "tau": round(self.tau, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "draft_ms": round(self.draft_ms, 3),
            "verify_ms": round(self.verify_ms, 3),
            "wait_ms": round(self.wait_ms, 3),
            "prefill_ms": round(self.prefill_ms, 3),
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "decode_tps": round(self.decode_tps, 3),
            "lookup_rounds": self.lookup_rounds,
            "lookup_drafted": self.lookup_drafted,
            "lookup_accepted": self.lookup_accepted,
            "lookup_tau": round(self.lookup_tau, 4),
            "longest_round": self.longest_round,
            "prediction_drafted": self.prediction_drafted,
            "prediction_accepted": self.prediction_accepted,
            "prediction_tokens": self.prediction_tokens,
            "prediction_used": self.prediction_used,
            "queue_ms": round(self.queue_ms, 3),
            "mean_batch_size": round(self.mean_batch_size, 4),
            "max_batch_size": self.max_batch_size,
            "datastore_rounds": self.datastore_rounds,
            "datastore_drafted": self.datastore_drafted,
            "datastore_accepted": self.datastore_accepted,
            "datastore_tau": round(self.datastore_tau, 4),
            "histogram": {str(k): v for k, v in sorted(self.histogram.items())},
        }


def tau(accepted: int, rounds: int) -> float:
    """τ, the one definition: mean tokens committed per round, accepted drafts plus the bonus
    token (1 .. block size); 0.0 before any round."""
    return (accepted + rounds) / rounds if rounds else 0.0
