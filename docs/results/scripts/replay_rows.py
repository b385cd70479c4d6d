"""Helpers of the round-by-round replays over teacher-forced continuations
(datastore_gate_sim.py, lookup_cap_sim.py, walk_confidence.py)."""

from dflash2_mlx.engine.datastore import Datastore
from dflash2_mlx.engine.lookup import DEFAULT_LOOKUP, ContextLookup


def agreed(t: list[int], a: int, proposal: list[int]) -> int:
    """How many of `proposal`'s tokens continue t after position a."""
    n = 0
    while n < len(proposal) and a + 1 + n < len(t) and t[a + 1 + n] == proposal[n]:
        n += 1
    return n


def model_free_rows(data: list[dict], store: Datastore, lookup_drafts: int, store_drafts: int):
    """Per sequence and anchor: (context lookup's proposal, the datastore's match or None)."""
    out = []
    for s in data:
        t, start = s["tokens"], s["start"]
        look = ContextLookup(DEFAULT_LOOKUP)
        look.extend(t[: start + 1])
        rows = []
        for a in range(start, start + len(s["ok"])):
            rows.append((look.propose(lookup_drafts), store.match(t[: a + 1], store_drafts)))
            look.extend(t[a + 1 : a + 2])
        out.append(rows)
    return out
