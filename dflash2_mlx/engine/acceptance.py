"""Lossless (Leviathan) acceptance of a round's drafts.

Greedy: the longest prefix equal to the target's argmax. Sampled: a draft d is accepted with
probability min(1, p(d) / q(d)), otherwise the normalized residual max(p - q, 0) is sampled,
so every committed token follows p exactly (dflash2_mlx/sampling.py). DFlash2's q lives on K
candidates (sparse).
"""

from __future__ import annotations

import mlx.core as mx

from ..sampling import SamplingParams, filtered_probs, pick, sample


def rejection_sample(
    drafts: mx.array, p, q: mx.array, candidates: mx.array | None, key: mx.array
) -> tuple[int, int]:
    """drafts [γ]; p: the target's probabilities, [γ+1, V] or a function giving row i's [V]
    (then a row is made only when it is reached: a round's rows after its first rejection
    cost nothing, where each is a softmax over the vocabulary); q [γ, V] (dense) or [γ, K]
    over `candidates` [γ, K] (distinct ids per row: DFlash2's top-K, or a draft vocabulary).
    Returns (accepted count a, bonus token)."""
    row = p if callable(p) else (lambda i: p[i])
    gamma = drafts.shape[0]
    k_accept, k_bonus = mx.random.split(key)
    if candidates is None:
        q_d = mx.take_along_axis(q, drafts[:, None], axis=-1)[:, 0]
    else:
        q_d = mx.sum(mx.where(candidates == drafts[:, None], q, 0.0), axis=-1)
    u = mx.random.uniform(shape=(gamma,), key=k_accept)
    bars = (u * q_d).tolist()  # draft i is accepted when p_i(d_i) exceeds bars[i]
    for i, d in enumerate(drafts.tolist()):
        p_i = row(i)
        if not bars[i] < p_i[d].item():
            return i, _residual_draw(
                p_i, q[i], None if candidates is None else candidates[i], k_bonus
            )
    return gamma, int(sample(row(gamma), k_bonus).item())


def _residual_draw(p_row: mx.array, q_row: mx.array, candidates, key) -> int:
    """A draw from the normalized max(p - q, 0) of a rejected position (p where it is 0)."""
    if candidates is None:
        residual = p_row - q_row
    else:
        # .add: an id listed twice has both its masses taken off, as q_d above counts them
        residual = p_row.at[candidates].add(-q_row)
    residual = mx.maximum(residual, 0.0)
    total = mx.sum(residual)
    residual = mx.where(total > 0, residual / mx.maximum(total, 1e-30), p_row)
    return int(sample(residual, key).item())


def accept(logits: mx.array, proposal, sp: SamplingParams, key) -> tuple[int, int]:
    """Verify `proposal` (an engine.proposal.Proposal) against the target's logits [γ+1, V] of [anchor] + drafts:
    (drafts accepted, bonus token) by greedy match or lossless rejection sampling."""
    drafts = proposal.drafts
    if sp.greedy:
        target_ids = mx.argmax(logits, axis=-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == target_ids[accepted]:
            accepted += 1
        return accepted, target_ids[accepted]
    if drafts:
        return rejection_sample(
            mx.array(drafts),
            lambda i: filtered_probs(logits[i], sp),
            proposal.q,
            proposal.candidates,
            key,
        )
    return 0, int(pick(logits[-1], sp, key).item())
