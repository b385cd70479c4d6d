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
    drafts: mx.array, p: mx.array, q: mx.array, candidates: mx.array | None, key: mx.array
) -> tuple[int, int]:
    """drafts [γ]; p [γ+1, V] target probs; q [γ, V] (dense) or [γ, K] over `candidates` [γ, K]
    (distinct ids per row: DFlash2's top-K, or a draft vocabulary).
    Returns (accepted count a, bonus token)."""
    gamma = drafts.shape[0]
    k_accept, k_bonus = mx.random.split(key)
    p_d = mx.take_along_axis(p[:gamma], drafts[:, None], axis=-1)[:, 0]
    if candidates is None:
        q_d = mx.take_along_axis(q, drafts[:, None], axis=-1)[:, 0]
    else:
        q_d = mx.sum(mx.where(candidates == drafts[:, None], q, 0.0), axis=-1)
    u = mx.random.uniform(shape=(gamma,), key=k_accept)
    ok = (u * q_d < p_d).astype(mx.int32)
    accepted = int(mx.sum(mx.cumprod(ok)).item())
    if accepted == gamma:
        return accepted, int(sample(p[gamma], k_bonus).item())
    row = p[accepted]
    if candidates is None:
        residual = row - q[accepted]
    else:
        # .add: an id listed twice has both its masses taken off, as q_d above counts them
        residual = row.at[candidates[accepted]].add(-q[accepted])
    residual = mx.maximum(residual, 0.0)
    total = mx.sum(residual)
    residual = mx.where(total > 0, residual / mx.maximum(total, 1e-30), row)
    return accepted, int(sample(residual, k_bonus).item())


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
            mx.array(drafts), filtered_probs(logits, sp), proposal.q, proposal.candidates, key
        )
    return 0, int(pick(logits[-1], sp, key).item())
