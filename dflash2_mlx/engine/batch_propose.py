"""A batched round's proposals: each row's own model-free proposal (constraint, prediction,
context lookup, datastore) where one is found, else its drafter block — one drafter pass for
all the rows that need it (drafter/batch.py)."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx

from ..drafter.batch import DraftRequest, draft_rows
from .generation import _Run
from .loop import SpeculativeDecoder
from .session import Session
from .proposal import NOTHING, Proposal


def propose_rows(
    dec: SpeculativeDecoder, rows: Sequence[tuple[Session, _Run]]
) -> tuple[list[Proposal], list[mx.array], list[Exception | None]]:
    """Every row's proposal, verify key and error. Each row splits its key as
    SpeculativeDecoder._round does, so a row proposes what it would alone. A row whose own
    proposing raises (its grammar) gets that error and no drafts; the others go on."""
    proposals: list[Proposal] = []
    verify_keys, errors, drafting, requests = [], [], [], []
    for i, (session, run) in enumerate(rows):
        run.key, k_draft, k_verify = mx.random.split(run.key, 3)
        verify_keys.append(k_verify)
        try:
            found = dec._model_free(session, run)
            length = 0 if found is not None else run.drafter_span(len(session.tokens))
            errors.append(None)
        except Exception as e:  # this row's own code: it alone fails
            found, length = None, 0
            errors.append(e)
        if found is None and length >= 2:
            drafting.append(i)
            requests.append(
                DraftRequest(
                    session.tokens[-1],
                    length,
                    session.pending,
                    session.drafter_cache,
                    run.params.sampling,
                    k_draft,
                )
            )
        proposals.append(found if found is not None else NOTHING)
    if requests:
        blocks = draft_rows(dec.bound_drafter(), requests)
        mx.eval([b.tokens for b in blocks])
        for i, block in zip(drafting, blocks):
            rows[i][0].pending = None
            proposals[i] = Proposal.from_drafter(block)
    return proposals, verify_keys, errors
