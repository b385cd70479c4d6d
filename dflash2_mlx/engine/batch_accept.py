"""A batched round's acceptance: each row accepts its verified drafts with its own sampling
parameters and key, as SpeculativeDecoder._round does alone. A row whose own code raises (a
logits processor, a grammar, its logprobs) keeps nothing of the round and leaves with that
error; the other rows go on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import mlx.core as mx

from .generation import _Run, cut, shape_logits
from .session import Session, record
from .proposal import Proposal
from .acceptance import accept
from .width import WidthRule


@dataclass
class RowOutcome:
    commit: list[int]  # tokens committed (its kept prefix of the verify width)
    drafted: int = 0  # drafts counted (never past max_tokens)
    accepted: int = 0
    finish: str | None = None
    logprobs: tuple = ()
    error: Exception | None = None  # this row failed: it commits nothing and leaves

    @classmethod
    def failed(cls, error: Exception) -> "RowOutcome":
        return cls([], finish="error", error=error)


def accept_rows(
    rows: Sequence[tuple[Session, _Run]],
    proposals: Sequence[Proposal],
    keys: Sequence[mx.array],
    errors: Sequence[Exception | None],
    fwd,
    widths: WidthRule,
) -> list[RowOutcome]:
    """Row i's outcome of the verify forward `fwd` (row i of its batch); a row with an
    error from proposing fails here without accepting."""
    out = []
    for i, ((session, run), p, key, error) in enumerate(zip(rows, proposals, keys, errors)):
        if error is None:
            try:
                out.append(_accept_row(session, run, p, key, fwd, i, widths))
                continue
            except Exception as e:  # this row's own code: it alone fails
                error = e
        out.append(RowOutcome.failed(error))
    return out


def _accept_row(
    session: Session, run: _Run, p: Proposal, key, fwd, i: int, widths: WidthRule
) -> RowOutcome:
    """Everything that can raise runs before `record` changes the session."""
    n = len(p.drafts) + 1
    logits = shape_logits(fwd.logits[i, :n], run, session.tokens, p.drafts)
    accepted, bonus = accept(logits, p, run.params.sampling, key)
    widths.observe(p.source, len(p.drafts), accepted)  # the batch's widths
    run.observe(p.source, len(p.drafts), accepted)  # its own drafter's (_Run.drafter_span)
    room = run.room
    commit, finish = cut(run, p.drafts[:accepted] + [bonus])
    logprobs = run.logprobs(logits, commit)
    record(session, commit, fwd.features[i : i + 1, : len(commit)])
    return RowOutcome(
        commit,
        drafted=min(len(p.drafts), room),  # drafts past max_tokens never count
        # a cut round (max_tokens, a stop): its last kept token counts as the bonus
        accepted=min(accepted, len(commit) - 1),
        finish=finish,
        logprobs=logprobs,
    )
