"""Whether a greedy generation's next round runs the drafter or decodes one token plainly.

A drafter round costs a draft pass plus a verify of its block; a plain round (no drafts: the
verify of the anchor alone is one step of plain decoding) costs a verify of width 1 and
commits one token. The drafter pays only where its drafts are accepted often enough: on a
CPU where a verify of 4 tokens costs ~1.2x one token and a small drafter's first draft is
accepted ~40 % of the time, a stretch of text the drafter does not know (a summary, small
talk) decodes slower than plain mlx-lm. So each greedy round compares, in expectation,

    drafter: E(p, block - 1) / (verify(block) + draft(block))   vs   plain: 1 / verify(1)

with E(p, d) = 1 + p + ... + p^d (each draft accepted with probability p given its
predecessors were), p the acceptance rate of the generation's recent drafter rounds (older
rounds fade), and the costs measured online from the generation's own rounds (round times
are in its events; before a plain round has run, verify(1) is estimated from verify(block)
by DEFAULT_VERIFY_SLOPE). After `probe_after` plain rounds in a row a drafter round runs
anyway, to measure p again. Greedy output does not depend on which rounds draft (each
commits the target's argmax), so this changes speed only; sampled generations always draft
(their random draws, hence a seeded request's output, must not depend on timing).
Model-free proposals (lookup, datastore, prediction) cost no draft pass and always run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .width import expected_committed

# Without a measured plain round: verify(w) ~ verify(1) * (1 + (w - 1) * slope) (this CPU with
# OpenBLAS, SmolLM2-135M: verify(4) / verify(1) ~ 1.19, docs/results/smollm2-autotune.json).
DEFAULT_VERIFY_SLOPE = 0.065


def _fade(old: float | None, new: float, memory: float) -> float:
    return new if old is None else memory * old + (1.0 - memory) * new


@dataclass
class DraftGate:
    """One greedy generation's choice between drafter rounds and plain rounds."""

    memory: float = 0.8  # weight of the past per drafter round (acceptance and costs)
    probe_after: int = 4  # plain rounds in a row before a drafter round re-measures p,
    # doubled (up to 8x) after each probe that leaves the drafter still not paying
    prior: float = 0.5  # acceptance rate before any drafter round (weighted as one round)
    accepted: float = 0.0  # faded count of accepted drafts
    rejected: float = 0.0  # faded count of rejections (rounds that did not accept all)
    plain_ms: float | None = None  # faded ms of a plain round
    drafter_ms: dict[int, float] = field(default_factory=dict)  # faded ms by block
    plain_streak: int = 0
    failed_probes: int = 0

    def rate(self) -> float:
        return (self.accepted + self.prior) / (self.accepted + self.rejected + 1.0)

    def pays(self, block: int) -> bool:
        """A drafter round of `block` tokens beats a plain round in expectation (True while
        its cost is not measured yet)."""
        cost = self.drafter_ms.get(block)
        if cost is None:
            return True
        plain = self.plain_ms
        if plain is None:
            plain = cost / (1.0 + (block - 1) * DEFAULT_VERIFY_SLOPE)
        return expected_committed(self.rate(), block - 1) / cost >= 1.0 / plain

    def draft(self, block: int) -> bool:
        """True: run the drafter for a block of `block` tokens (anchor included)."""
        if block < 2:
            return False
        wait = self.probe_after << min(self.failed_probes, 3)
        return self.plain_streak >= wait or self.pays(block)

    def observe(self, source: str, drafted: int, accepted: int, round_ms: float) -> None:
        """A round ran: `source` proposed `drafted` drafts, `accepted` of them were accepted,
        the round took `round_ms` (draft + verify)."""
        if drafted == 0:
            self.plain_ms = _fade(self.plain_ms, round_ms, self.memory)
            self.plain_streak += 1
            return
        if source != "drafter":
            return
        probe, self.plain_streak = self.plain_streak > 0, 0
        m = self.memory
        self.accepted = m * self.accepted + accepted
        self.rejected = m * self.rejected + (accepted < drafted)
        block = drafted + 1
        self.drafter_ms[block] = _fade(self.drafter_ms.get(block), round_ms, m)
        self.failed_probes = self.failed_probes + 1 if probe and not self.pays(block) else 0
