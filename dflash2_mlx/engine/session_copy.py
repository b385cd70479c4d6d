"""Copies of a session, and what it holds: a prompt cache's entries (engine/prompt_cache.py).

Copies are cheap: MLX arrays have value semantics, so a copy holds new handles on the same
buffers and the first write through either handle copies the buffer.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from ..drafter.attention import ContextCache
from .session import Session


def _is_cache(x) -> bool:
    return hasattr(x, "__dict__") and hasattr(type(x), "state")


def _clone(x):
    """x with every array behind a new handle (same buffer), containers and caches copied."""
    if isinstance(x, mx.array):
        return x[...]
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if _is_cache(x):
        new = copy.copy(x)
        for name, value in vars(x).items():
            setattr(new, name, _clone(value))
        return new
    return x


def _arrays(x):
    """The arrays inside x (containers and cache objects walked)."""
    if isinstance(x, mx.array):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _arrays(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _arrays(v)
    elif _is_cache(x):
        for v in vars(x).values():
            yield from _arrays(v)


def clone_session(session: Session) -> Session:
    """An independent copy of `session`: using either never changes the other."""
    return replace(
        session,
        target_cache=_clone(session.target_cache),
        drafter_cache=_clone(session.drafter_cache),
        tokens=list(session.tokens),
        pending=_clone(session.pending),
        lookup=copy.deepcopy(session.lookup),
        prediction=None,
        holder=None,  # a copy is not in use by the generation that uses the original
        on_checkpoint=None,
        branch_points=(),
    )


def compact(session: Session) -> None:
    """KV buffers cut to the rows they hold where the spare room is large: mlx-lm (and the
    drafter's context cache) allocates 256 rows at a time, so a short conversation kept whole
    would hold (and count against the budget) up to 256 rows a layer. A continuation
    allocates again as it goes."""
    for c in session.target_cache:
        if type(c) is KVCache and c.keys is not None and c.keys.shape[2] - c.offset > c.offset // 8:
            c.keys = mx.contiguous(c.keys[..., : c.offset, :])
            c.values = mx.contiguous(c.values[..., : c.offset, :])
    for c in session.drafter_cache:
        if isinstance(c, ContextCache):
            c.compact()


def session_nbytes(session: Session) -> int:
    """Bytes of a session's cache arrays and pending features (what an entry keeps alive)."""
    return sum(a.nbytes for a in session_arrays(session))


def session_arrays(session: Session) -> list[mx.array]:
    return list(_arrays([session.target_cache, session.drafter_cache, session.pending]))
