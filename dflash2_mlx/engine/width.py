"""Each batched round's verify width: how far the rows' proposals are cut (and, for one
sequence at a long context, `cut_to_rate`: GenerationParams.verify_cost).

A batched verify pads every row to the widest proposal, so one long lookup proposal (up to
lookup_block - 1 tokens) makes every row pay its width. Each round picks the cap W (tokens
verified per row, anchor included) that maximises expected committed tokens per unit of
verify cost:

    sum_i E_i(min(d_i, W - 1)) / cost(B, W),   E(n) = 1 + p + p^2 + ... + p^n

where d_i is row i's proposal length and p the acceptance rate of its source (drafter,
lookup, prediction), each draft accepted with probability p given its predecessors were (the
rate is estimated from the rounds so far: accepted drafts / (accepted drafts + rejections)).
The widths compared (ties: the wider) are the proposals' own and those the autotuner
measures (MEASURED_WIDTHS: others are interpolated, and odd widths run slower than both even
neighbours with x86 OpenBLAS), so rows of one length are cut too (`cut_uniform`): a block
chosen for one sequence can be too wide for several rows whose drafts are seldom accepted
(4 rows x 8 tokens cost 1.5x 4 x 4 on this project's CPU, for ~0.04 more tokens a row at
p = 0.4). Cutting a proposal verifies a prefix of it: each draft's distribution is its own
conditional, so acceptance stays exact; only greedy rows are cut (a sampled row's draws,
hence a seeded request's output, depend on how many drafts it verifies), so a request still
returns what it returns alone.

`cost(B, W)` comes from a measured table (ms of one verify over B rows of width W:
costs.batch_verify_costs, stored by the autotuner, read by batch_costs.width_costs) or,
without one, `default_cost`'s linear model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .proposal import Proposal

# Without a measured table: a verify over n tokens (rows x width) costs 1 + n / TOKENS_PER_UNIT
# forwards of one token. Measured on this project's x86 CPU with OpenBLAS for SmolLM2-135M:
# 16 tokens ~1.8x one token (docs/env.md); on Apple GPUs the slope is smaller.
TOKENS_PER_UNIT = 20.0
# The verify widths the autotuner times over 1, 2 and 4 rows (its batch table).
MEASURED_WIDTHS = (1, 2, 4, 8, 12, 16)


def default_cost(rows: int, width: int) -> float:
    return 1.0 + (rows * width - 1) / TOKENS_PER_UNIT


def expected_committed(p: float, drafts: int) -> float:
    """1 + p + ... + p^drafts: tokens a round commits (the bonus included), in expectation."""
    return sum(p**k for k in range(drafts + 1))


def choose_width(
    lengths: Sequence[int],
    probs: Sequence[float],
    cost: Callable[[int, int], float],
    floor: int = 1,
) -> int:
    """The cap W >= floor (anchor included) for proposals of `lengths` drafts with
    acceptance `probs`."""
    rows = len(lengths)
    best, best_rate = floor, -1.0
    longest = max(lengths, default=0) + 1
    widths = {d + 1 for d in lengths} | {w for w in MEASURED_WIDTHS if w <= longest}
    for width in sorted(w for w in widths if w >= floor):
        gain = sum(expected_committed(p, min(d, width - 1)) for d, p in zip(lengths, probs))
        rate = gain / max(cost(rows, width), 1e-9)
        if rate >= best_rate:
            best, best_rate = width, rate
    return best


def cut_to_rate(p: Proposal, rate: float, cost: Callable[[int], float]) -> Proposal:
    """One sequence's proposal cut to the width with the most expected committed tokens per
    unit of cost(width), each draft accepted with probability `rate` (choose_width)."""
    return shorten(p, choose_width([len(p.drafts)], [rate], lambda _rows, w: cost(w)) - 1)


def shorten(p: Proposal, drafts: int) -> Proposal:
    """The proposal's first `drafts` drafts (with their distributions)."""
    if len(p.drafts) <= drafts:
        return p
    q = None if p.q is None else p.q[:drafts]
    candidates = None if p.candidates is None else p.candidates[:drafts]
    return Proposal(p.drafts[:drafts], q, candidates, p.source)


@dataclass
class WidthRule:
    """Chooses each batched round's width and learns each source's acceptance rate."""

    cost: Callable[[int, int], float] = default_cost
    # Cut rows of one length too, not only a ragged round's padding: where `cost` is measured,
    # or the default model fits (a CPU). On a GPU a wide verify may cost little more than a
    # narrow one, and the default model would cut rounds that pay.
    cut_uniform: bool = True
    prior: float = 0.5  # acceptance rate before any round (weighted as `prior_rounds`)
    prior_rounds: float = 2.0
    accepted: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, float] = field(default_factory=dict)

    def rate(self, source: str) -> float:
        a, r = self.accepted.get(source, 0.0), self.rejected.get(source, 0.0)
        w = self.prior_rounds
        return (a + w * self.prior) / (a + r + w)

    def observe(self, source: str, drafted: int, accepted: int) -> None:
        if drafted:
            self.accepted[source] = self.accepted.get(source, 0.0) + accepted
            self.rejected[source] = self.rejected.get(source, 0.0) + (accepted < drafted)

    def cap(self, proposals: Sequence[Proposal], fixed: Sequence[bool]) -> list[Proposal]:
        """The proposals cut to this round's width (unchanged when all fit). `fixed` rows are
        never cut: a sampled row's draws depend on how many drafts it verifies, and a seeded
        request must return in a batch what it returns alone (a greedy row's commit does not
        depend on where its proposal is cut)."""
        lengths = [len(p.drafts) for p in proposals]
        if len(proposals) < 2 or max(lengths) < 1:
            return list(proposals)  # nothing drafted, or a lone row (the single engine's round)
        if not self.cut_uniform and len(set(lengths)) < 2:
            return list(proposals)  # no padding to save
        floor = max((d for d, f in zip(lengths, fixed) if f), default=0) + 1
        probs = [self.rate(p.source) for p in proposals]
        width = choose_width(lengths, probs, self.cost, floor)
        return [p if f else shorten(p, width - 1) for p, f in zip(proposals, fixed)]
