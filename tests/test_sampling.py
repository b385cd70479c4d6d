"""Speculative sampling must follow the target's distribution (rejection sampling)."""

import itertools

import mlx.core as mx
import numpy as np
import pytest
import tiny

from dflash2_mlx import GenerationParams, ParameterError, SamplingParams, SpeculativeDecoder
from dflash2_mlx.engine.acceptance import rejection_sample
from dflash2_mlx.sampling import filtered_probs
from dflash2_mlx.target.adapter import TargetAdapter

V = 12
PROMPT = [1, 5, 3]


def exact_marginals(model, sp: SamplingParams, prompt=PROMPT):
    """Exact P(t1), P(t2), P(t3) after `prompt` under the filtered target distribution."""
    p1 = np.array(filtered_probs(model(mx.array([prompt]))[0, -1], sp))
    seq2 = mx.array([prompt + [a] for a in range(V)])
    p2 = np.array(filtered_probs(model(seq2)[:, -1], sp))  # [t1, t2]
    seq3 = mx.array([prompt + [a, b] for a, b in itertools.product(range(V), range(V))])
    p3 = np.array(filtered_probs(model(seq3)[:, -1], sp)).reshape(V, V, V)
    j2 = p1[:, None] * p2
    return p1, j2.sum(0), (j2[:, :, None] * p3).sum((0, 1))


def empirical(decoder, sp, n, prompt=PROMPT):
    counts = np.zeros((3, V))
    for seed in range(n):
        params = GenerationParams(
            max_tokens=3,
            block_size=3,
            sampling=SamplingParams(sp.temperature, sp.top_p, sp.top_k, sp.min_p, seed=seed),
        )
        out = decoder.generate(prompt, params)
        for i, t in enumerate(out):
            counts[i, t] += 1
    return counts / n


def tv(a, b):
    return 0.5 * np.abs(a - b).sum()


@pytest.mark.slow
@pytest.mark.parametrize(
    "version,sp",
    [
        # T=1 without filters: the draft-vocabulary test runs it with both versions (and the
        # lookup, datastore and prediction tests with version 2); these add every filter.
        (1, SamplingParams(temperature=0.8, top_k=6, top_p=0.9)),
        (2, SamplingParams(temperature=1.2, min_p=0.05)),
    ],
)
def test_speculative_sampling_matches_target(version, sp):
    model = tiny.make_target("llama", vocab=V, seed=11)
    drafter = tiny.make_drafter(version, vocab=V, mask_token_id=V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    n = 1200
    emp = empirical(dec, sp, n)
    exact = exact_marginals(model, sp)
    # With 1200 draws over 12 outcomes the expected TV is ~0.04; a biased sampler
    # (e.g. accepting every draft) is off by far more (checked below).
    for i in range(3):
        assert tv(emp[i], exact[i]) < 0.085, (i, tv(emp[i], exact[i]))


@pytest.mark.parametrize("version", [1, 2])
def test_a_seeded_reply_does_not_depend_on_max_tokens(version):
    """The rounds of a sampled generation (their proposals, hence their draws) never depend on
    max_tokens: a seeded reply cut at N tokens is the first N of a longer one (as with plain
    decoding), through drafter, lookup and prediction rounds."""
    model = tiny.make_target("llama", vocab=V, seed=11)
    drafter = tiny.make_drafter(version, vocab=V, mask_token_id=V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=1
    )
    for seed in (3, 4):
        sp = SamplingParams(temperature=1.0, seed=seed)
        kw = dict(block_size=4, sampling=sp, prediction=(1, 5, 3, 2, 1, 5))
        whole = dec.generate(PROMPT, GenerationParams(max_tokens=30, **kw))
        assert len(whole) == 30
        for n in (1, 2, 3, 5, 8, 13, 21):
            assert dec.generate(PROMPT, GenerationParams(max_tokens=n, **kw)) == whole[:n], n
            produced = 0  # the stats count only drafts that could have been committed
            for ev in dec.stream(PROMPT, GenerationParams(max_tokens=n, **kw)):
                assert ev.drafted <= n - produced and ev.accepted <= ev.drafted
                produced += len(ev.tokens)


def test_an_unseeded_reply_follows_mx_random_seed_as_mlx_lm_does():
    """No seed: the run draws its own from MLX's global generator, so mx.random.seed(n)
    before it reproduces it (as mlx-lm's sampling does), and runs after one another differ."""
    model = tiny.make_target("llama", vocab=V, seed=11)
    drafter = tiny.make_drafter(2, vocab=V, mask_token_id=V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    params = GenerationParams(max_tokens=24, sampling=SamplingParams(temperature=1.0))
    mx.random.seed(5)
    first = [dec.generate(PROMPT, params) for _ in range(3)]
    mx.random.seed(5)
    assert [dec.generate(PROMPT, params) for _ in range(3)] == first
    assert len({tuple(r) for r in first}) > 1
    # greedy draws nothing from it, as mlx-lm's greedy: a caller's seeded draws stay theirs
    mx.random.seed(5)
    alone = mx.random.uniform(shape=(2,)).tolist()
    mx.random.seed(5)
    dec.generate(PROMPT, GenerationParams(max_tokens=8))
    assert mx.random.uniform(shape=(2,)).tolist() == alone


def test_the_distribution_check_can_fail():
    """Sanity of the statistic: the draft distribution itself is far from the target's."""
    model = tiny.make_target("llama", vocab=V, seed=11)
    sp = SamplingParams(temperature=1.0)
    drafter = tiny.make_drafter(1, vocab=V, mask_token_id=V - 1, seed=12)
    adapter = TargetAdapter(model, drafter.config.target_layer_ids)
    drafter.bind(adapter.binding())
    fwd = adapter.forward(mx.array([PROMPT]), adapter.make_cache())
    block = mx.array([[PROMPT[-1], V - 1]])
    q = np.array(filtered_probs(drafter(block, fwd.features, drafter.make_cache())[0, 1], sp))
    p = np.array(filtered_probs(fwd.logits[0, -1], sp))
    assert tv(p, q) > 0.2


def test_rejection_sample_unit():
    """Exact check of the accept / residual rule on a 3-token vocabulary."""
    p = mx.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = mx.array([[0.2, 0.7, 0.1]])
    n = 6000
    counts = np.zeros(3)
    accepted = 0
    for s in range(n):
        d = int(mx.random.categorical(mx.log(q[0]), key=mx.random.key(10_000 + s)).item())
        a, bonus = rejection_sample(mx.array([d]), p, q, None, mx.random.key(s))
        first = d if a == 1 else bonus
        counts[first] += 1
        accepted += a
    assert tv(counts / n, np.array([0.5, 0.3, 0.2])) < 0.03
    # P(accept) = sum_x min(p, q) = 0.2 + 0.3 + 0.1 = 0.6
    assert abs(accepted / n - 0.6) < 0.03


def test_sparse_rejection_residual():
    """Sparse q over candidates: rejecting every draft leaves exactly the residual."""
    p = mx.array([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = mx.array([[1.0, 0.0]])  # all mass on candidate 0 (token 0, where p = 0)
    cand = mx.array([[0, 3]])
    counts = np.zeros(4)
    for s in range(2000):
        a, bonus = rejection_sample(mx.array([0]), p, q, cand, mx.random.key(s))
        assert a == 0
        counts[bonus] += 1
    assert counts[0] == 0 and counts[3] == 0
    assert abs(counts[1] / 2000 - 0.5) < 0.05


def test_a_candidate_listed_twice_has_both_masses_taken_off_the_residual():
    """Sparse q whose candidates repeat an id: the residual subtracts both copies' mass, as
    the acceptance ratio counts them, so the first token still follows p."""
    p = mx.array([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q, cand = mx.array([[0.4, 0.4, 0.2]]), mx.array([[0, 0, 1]])
    n, counts = 4000, np.zeros(3)
    for s in range(n):
        j = int(mx.random.categorical(mx.log(q[0]), key=mx.random.key(50_000 + s)).item())
        d = int(cand[0, j].item())
        a, bonus = rejection_sample(mx.array([d]), p, q, cand, mx.random.key(s))
        counts[d if a == 1 else bonus] += 1
    # TV 0.035 is 4.4 sigma: a false failure ~1e-5 (0.03 was ~1.6e-4)
    assert tv(counts / n, np.array([0.5, 0.5, 0.0])) < 0.035, counts / n


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_sampling_params_are_rejected(kwargs, needle):
    with pytest.raises(ParameterError, match=needle):
        SamplingParams(**kwargs)


def test_bad_generation_params_are_rejected():
    with pytest.raises(ParameterError, match="max_tokens"):
        GenerationParams(max_tokens=0)
    model = tiny.make_target("llama")
    drafter = tiny.make_drafter(2, block_size=8)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    with pytest.raises(ParameterError, match="trained block size 8"):
        dec.generate([1, 2], GenerationParams(max_tokens=4, block_size=9))
    with pytest.raises(ParameterError, match="empty"):
        dec.generate([], GenerationParams(max_tokens=4))


def test_underflowing_temperature_and_top_p_never_sample_nans():
    """A temperature so small that logits / T overflows float32, or a top_p that rounds to 0
    in float32, is the T -> 0 / top-1 limit: greedy, never a vocabulary of NaNs."""
    logits = mx.array([[1.0, 30.0, 29.5, -4.0]])
    for t in (1e-31, 1e-38, 1e-39, 5e-324):
        sp = SamplingParams(temperature=t)
        assert sp.greedy and sp.temperature == 0.0
        assert np.array(filtered_probs(logits, sp)).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    honoured = SamplingParams(temperature=1e-29)  # above the limit: sampled, still finite
    assert not honoured.greedy
    p = np.array(filtered_probs(logits * 1e6, honoured))
    assert np.isfinite(p).all() and p.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    p = np.array(filtered_probs(logits, SamplingParams(temperature=1.0, top_p=1e-46)))
    assert p.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    model = tiny.make_target("llama", vocab=V, seed=11)
    drafter = tiny.make_drafter(2, vocab=V, mask_token_id=V - 1, seed=12, top_k=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    greedy = dec.generate(PROMPT, GenerationParams(max_tokens=8, block_size=4))
    for sp in (
        SamplingParams(temperature=1e-39, seed=1),
        SamplingParams(temperature=1e-29, seed=1),
        SamplingParams(temperature=1.0, top_p=1e-46, seed=1),
    ):
        out = dec.generate(PROMPT, GenerationParams(max_tokens=8, block_size=4, sampling=sp))
        assert out == greedy, sp


def test_the_filter_is_mlx_lms_sampler():
    """The target distribution is the one mlx-lm's make_sampler draws from: top_p and min_p
    cut the untempered distribution, top_k what is left, then the temperature. The filter
    applied the temperature first (transformers' order): at T 0.6 / top_p 0.95 it left out
    tokens mlx-lm samples. Compared with mlx-lm's own filters, on rows whose nucleus lies
    among the likeliest 1,024 tokens and beyond."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    def mlx_lm_probs(logits, sp):
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        lp = apply_top_p(lp, sp.top_p) if sp.top_p < 1 else lp
        lp = apply_min_p(lp, sp.min_p) if sp.min_p else lp
        lp = apply_top_k(lp, sp.top_k) if 0 < sp.top_k < logits.shape[-1] else lp
        return mx.softmax(lp * (1.0 / sp.temperature), axis=-1)

    mx.random.seed(0)
    for vocab, scale in ((50, 2.0), (3000, 0.5), (3000, 6.0)):
        logits = mx.random.normal((4, vocab)) * scale
        for t, top_p, min_p, top_k in itertools.product(
            (0.3, 0.6, 1.0, 1.6), (1.0, 0.5, 0.9, 0.95), (0.0, 0.05, 1.0), (0, 20, 2000)
        ):
            sp = SamplingParams(temperature=t, top_p=top_p, min_p=min_p, top_k=top_k)
            ours, theirs = np.array(filtered_probs(logits, sp)), np.array(mlx_lm_probs(logits, sp))
            assert tv(ours, theirs) < 1e-3, sp
            if scale > 1:  # no token within float rounding of the nucleus's edge: the same
                assert ((ours > 1e-30) == (theirs > 1e-30)).all(), sp  # tokens can be drawn
    # a tie at the nucleus's edge: every token as likely as its last one, as mlx-lm keeps them
    tied = mx.array([[3.0, 1.0, 1.0, 1.0, 0.0, -1.0]])
    sp = SamplingParams(temperature=1.0, top_p=0.7)
    assert (np.array(filtered_probs(tied, sp)) > 0).sum() == 4
    assert (np.array(mlx_lm_probs(tied, sp)) > 0).sum() == 4


def test_top_k_keeps_exactly_k_tokens_when_the_kth_is_tied():
    """Ties at the k-th logit (common in bf16) all stayed in: top_k 2 sampled from 5 tokens.
    mlx-lm's apply_top_k keeps exactly k, and so does the filter (which of the tied, either
    may pick)."""
    logits = mx.array([[3.0, 2.0, 2.0, 2.0, 1.0, 2.0]])
    kept = (filtered_probs(logits, SamplingParams(temperature=1.0, top_k=2)) > 0)[0].tolist()
    assert sum(kept) == 2 and kept[0] and not kept[4]


def test_the_nucleus_among_the_likeliest_tokens_is_the_full_sorts():
    """top_p's nucleus is found among the most likely tokens by a partial selection (a full
    sort of each verified row cost a CPU more than the rest of the sampling); a row whose
    nucleus is larger falls back to the full sort. The mask is the same either way, on rows
    peaked and flat, and with a top_k before it."""
    from dflash2_mlx.sampling import nucleus

    vocab = 5000
    mx.random.seed(3)
    peaked = mx.random.normal((4, vocab)) * 4
    flat = mx.random.normal((2, vocab)) * 0.1  # its nucleus holds most of the vocabulary
    for rows in (peaked, mx.concatenate([peaked, flat])):
        probs = mx.softmax(rows, axis=-1)
        for top_p in (0.3, 0.9, 0.99):
            fast = nucleus(probs, top_p, candidates=256)
            assert mx.array_equal(fast, nucleus(probs, top_p, candidates=vocab)).item(), top_p
            assert mx.all(mx.sum(fast, axis=-1) >= 1).item()
    # bf16 logits tie often: the tied tokens at the nucleus's edge are the full sort's too
    tied = mx.softmax((peaked * 3).astype(mx.bfloat16).astype(mx.float32), axis=-1)
    for top_p in (0.5, 0.8, 0.95):
        fast = nucleus(tied, top_p, candidates=256)
        assert mx.array_equal(fast, nucleus(tied, top_p, candidates=vocab)).item(), top_p
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=300)
    kept = filtered_probs(peaked, sp) > 0
    assert mx.all(mx.sum(kept, axis=-1) <= 300).item()


def test_rows_made_as_they_are_reached_accept_as_all_rows_at_once():
    """A sampled round makes each verified row's probabilities only when acceptance reaches
    it (rows after the first rejection are never needed): the same accepted count and bonus
    as from every row at once, draw for draw, with dense and candidate q."""
    mx.random.seed(5)
    gamma, vocab = 6, 3000  # past the nucleus's 1,024 candidates
    logits = mx.random.normal((gamma + 1, vocab)) * 2
    sp = SamplingParams(temperature=0.8, top_p=0.9)
    p = filtered_probs(logits, sp)
    # a drafter near the target: its drafts are accepted or not, by chance
    q_logits = logits[:gamma] + mx.random.normal((gamma, vocab))
    dense_q = mx.softmax(q_logits, axis=-1)
    cand = mx.argsort(-q_logits, axis=-1)[:, :16]
    sparse_q = mx.softmax(mx.take_along_axis(q_logits, cand, axis=-1), axis=-1)
    seen = set()
    for q, c in ((dense_q, None), (sparse_q, cand)):
        for s in range(40):
            key, k_draft = mx.random.split(mx.random.key(s))
            picked = mx.random.categorical(mx.log(q), key=k_draft)
            drafts = picked if c is None else mx.take_along_axis(c, picked[:, None], -1)[:, 0]
            made = []

            def row(i):
                made.append(i)
                return filtered_probs(logits[i], sp)

            lazy = rejection_sample(drafts, row, q, c, key)
            assert lazy == rejection_sample(drafts, p, q, c, key) == _all_rows(drafts, p, q, c, key)
            assert made == list(range(lazy[0] + 1))  # up to the first rejection (or the bonus)
            seen.add(lazy[0])
    assert len(seen) > 2  # rounds that stopped at different positions


def _all_rows(drafts, p, q, candidates, key):
    """The acceptance as it was before rows were made lazily (every row at once): the
    reference the lazy one must match draw for draw."""
    from dflash2_mlx.sampling import sample

    gamma = drafts.shape[0]
    k_accept, k_bonus = mx.random.split(key)
    p_d = mx.take_along_axis(p[:gamma], drafts[:, None], axis=-1)[:, 0]
    if candidates is None:
        q_d = mx.take_along_axis(q, drafts[:, None], axis=-1)[:, 0]
    else:
        q_d = mx.sum(mx.where(candidates == drafts[:, None], q, 0.0), axis=-1)
    u = mx.random.uniform(shape=(gamma,), key=k_accept)
    accepted = int(mx.sum(mx.cumprod((u * q_d < p_d).astype(mx.int32))).item())
    if accepted == gamma:
        return accepted, int(sample(p[gamma], k_bonus).item())
    row = p[accepted]
    if candidates is None:
        residual = row - q[accepted]
    else:
        residual = row.at[candidates[accepted]].add(-q[accepted])
    residual = mx.maximum(residual, 0.0)
    total = mx.sum(residual)
    residual = mx.where(total > 0, residual / mx.maximum(total, 1e-30), row)
    return accepted, int(sample(residual, k_bonus).item())
