"""Drafter building blocks: the dynamic conv, the selector lattice, and v2 ⊇ v1."""

import itertools

import mlx.core as mx
import numpy as np
import pytest
import tiny
from mlx.utils import tree_flatten

from dflash2_mlx.drafter.conv import GroupedDynamicConv
from dflash2_mlx.kernels import _references as reference
from dflash2_mlx.kernels import expected_walk_choices
from dflash2_mlx.kernels._references import dynamic_conv, pair_scores, walk
from dflash2_mlx.target.adapter import TargetAdapter


def naive_conv(x, dyn, base, g):
    """Loop version of the DFlash2 grouped dynamic conv: sum_k (base[k,c] + dyn[t,k,c//g]) * x[t-k, c]."""
    x, dyn, base = np.array(x), np.array(dyn), np.array(base)
    L, H = x.shape
    out = np.zeros_like(x)
    for t in range(L):
        for k in range(base.shape[0]):
            if t - k < 0:
                continue
            for c in range(H):
                out[t, c] += (base[k, c] + dyn[t, k, c // g]) * x[t - k, c]
    return out


def test_dynamic_conv_matches_definition_and_never_crosses_block_start():
    mx.random.seed(0)
    for L, taps in [(1, 2), (2, 2), (5, 2), (6, 3)]:
        x = mx.random.normal((L, 32))
        dyn = mx.random.normal((L, taps, 4))
        base = mx.random.normal((taps, 32))
        got = dynamic_conv(x, dyn, base, 8)
        np.testing.assert_allclose(np.array(got), naive_conv(x, dyn, base, 8), rtol=1e-5, atol=1e-5)
    # Row 0 depends on nothing before it: changing rows >= 1 leaves row 0 unchanged,
    # and changing row t never changes rows < t (causal inside the block).
    x = mx.random.normal((4, 32))
    dyn = mx.random.normal((4, 2, 4))
    base = mx.random.normal((2, 32))
    y0 = np.array(dynamic_conv(x, dyn, base, 8))
    x2 = mx.concatenate([x[:2], x[2:] + 5.0])
    y1 = np.array(dynamic_conv(x2, dyn, base, 8))
    np.testing.assert_allclose(y0[:2], y1[:2])


def test_conv_identity_init():
    conv = GroupedDynamicConv(32, 2, 8)
    u = mx.random.normal((1, 5, 32))
    prepared, dyn = conv.prepare(u)
    np.testing.assert_allclose(np.array(prepared), np.array(u))
    np.testing.assert_allclose(np.array(conv.finish(u * 2, dyn)), np.array(u * 2))


def test_pair_scores_match_loop():
    mx.random.seed(1)
    g, k, r = 4, 5, 7
    unary, hidden = mx.random.normal((g, k)), mx.random.normal((g, r))
    preds, succs = mx.random.normal((g, k, r)), mx.random.normal((g, k, r))
    got = np.array(pair_scores(unary, hidden, preds, succs))
    for t in range(g):
        for a in range(k):
            for b in range(k):
                want = float(unary[t, b]) + float(mx.sum(preds[t, a] * hidden[t] * succs[t, b]))
                assert abs(got[t, a, b] - want) < 1e-4


def test_greedy_walk_follows_previous_choice():
    lattice = mx.zeros((3, 2, 2))
    lattice[0, 0] = mx.array([0.0, 1.0])  # anchor -> pick 1
    lattice[1, 1] = mx.array([5.0, 0.0])  # after 1 -> pick 0
    lattice[1, 0] = mx.array([0.0, 5.0])
    lattice[2, 0] = mx.array([0.0, 3.0])  # after 0 -> pick 1
    lattice[2, 1] = mx.array([3.0, 0.0])
    picks, q = walk(lattice, 0.0)
    assert picks.tolist() == [1, 0, 1] and q is None
    picks, q = walk(lattice, 0.5, mx.random.key(0))
    assert q.shape == (3, 2)
    np.testing.assert_allclose(np.array(q.sum(-1)), 1.0, rtol=1e-6)


def _expected_accepted(lattice: np.ndarray, path, calibration: float) -> float:
    """E = p1 + p1 p2 + ... of `path` under softmax(lattice / calibration)."""
    z = lattice / calibration
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    total, run, prev = 0.0, 1.0, 0
    for t, b in enumerate(path):
        run *= p[t, prev, b]
        total += run
        prev = b
    return total


def test_expected_walk_maximises_expected_accepted_drafts():
    """Among all K^g paths (brute force), the expected walk's has the largest expected number
    of accepted drafts; the stepwise walk's is never better."""
    for seed in range(8):
        lattice = 2.0 * mx.random.normal((4, 4, 4), key=mx.random.key(seed))  # g 4, K 4
        lat = np.array(lattice)
        got = expected_walk_choices(lattice, 1.5).tolist()
        best = max(
            itertools.product(range(4), repeat=4), key=lambda p: _expected_accepted(lat, p, 1.5)
        )
        assert _expected_accepted(lat, got, 1.5) == pytest.approx(
            _expected_accepted(lat, best, 1.5), rel=1e-5
        )
        stepwise = walk(lattice, 0.0)[0].tolist()
        assert _expected_accepted(lat, stepwise, 1.5) <= _expected_accepted(lat, got, 1.5) + 1e-6
    # The two differ: the likelier first draft leads to a coin flip, the other to a sure one.
    lattice = mx.array([[[1.0, 0.8], [1.0, 0.8]], [[0.0, 0.0], [10.0, 0.0]]])
    assert walk(lattice, 0.0)[0].tolist() == [0, 0]
    assert expected_walk_choices(lattice, 1.5).tolist() == [1, 0]
    # Leading dimensions: each lattice walked as alone; one row: its argmax.
    batch = mx.random.normal((3, 5, 4, 4), key=mx.random.key(9))
    rows = [expected_walk_choices(batch[i], 1.5).tolist() for i in range(3)]
    assert expected_walk_choices(batch, 1.5).tolist() == rows
    one = mx.random.normal((1, 1, 6), key=mx.random.key(10))
    assert expected_walk_choices(one, 1.5).tolist() == [int(mx.argmax(one[0, 0]).item())]


def test_expected_walk_values_are_the_best_expected_accepted_drafts():
    """The reference's values: V_t(a), every step and predecessor row, is the largest expected
    number of drafts accepted from step t on after row a (brute force over the suffixes), so
    values[0, 0] is the chosen path's E; its choices are the op's."""
    for seed in range(4):
        lattice = 2.0 * mx.random.normal((3, 4, 4), key=mx.random.key(20 + seed))
        z = np.array(lattice) / 1.5
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        choices, values = reference.expected_walk(lattice, 1.5)
        assert choices.tolist() == expected_walk_choices(lattice, 1.5).tolist()
        for t, a in itertools.product(range(3), range(4)):
            best = 0.0
            for path in itertools.product(range(4), repeat=3 - t):
                total, run, prev = 0.0, 1.0, a
                for s, b in enumerate(path, start=t):
                    run *= p[s, prev, b]
                    total += run
                    prev = b
                best = max(best, total)
            assert values[t, a].item() == pytest.approx(best, rel=1e-5)
        got = _expected_accepted(np.array(lattice), choices.tolist(), 1.5)
        assert values[0, 0].item() == pytest.approx(got, rel=1e-5)


def test_dflash2_with_identity_conv_and_zero_successors_drafts_like_v1():
    """Spec §9.10a: identity conv + zero successor codebook => the DFlash v1 drafts."""
    model = tiny.make_target("llama")
    v2 = tiny.make_drafter(2, seed=3, randomize_v2=False)
    v2.candidate_selector.successor_codebook = mx.zeros_like(
        v2.candidate_selector.successor_codebook
    )
    v1 = tiny.make_drafter(1, seed=99)
    shared = {
        k: v
        for k, v in tree_flatten(v2.parameters())
        if not k.startswith("candidate_selector") and "_conv" not in k
    }
    v1.load_weights(list(shared.items()), strict=True)
    adapter = TargetAdapter(model, v1.config.target_layer_ids)
    for d in (v1, v2):
        d.bind(adapter.binding())
    fwd = adapter.forward(mx.array([[3, 14, 15, 9, 26, 5, 35]]), adapter.make_cache())
    block = mx.array([[26] + [v1.config.mask_token_id] * 7])
    h1 = v1.hidden(block, fwd.features, v1.make_cache())[0, 1:]
    h2 = v2.hidden(block, fwd.features, v2.make_cache())[0, 1:]
    np.testing.assert_allclose(np.array(h1), np.array(h2), atol=1e-5)
    drafts_v1 = mx.argmax(v1.logits(h1), axis=-1).tolist()
    sel = v2.select(h2, v2.logits(h2), mx.array(26), 0.0)
    assert sel.tokens.tolist() == drafts_v1


def test_candidates_come_in_id_order_whatever_their_scores():
    """A sampled walk's draws follow the candidates' order, so it must not move with float
    noise: the same top-16 set with its scores permuted (argpartition's order follows them)
    gives the same ids in the same order, ascending, each with its own score."""
    from dflash2_mlx.drafter.selector import CandidateSelector

    rng = np.random.default_rng(0)
    sel = CandidateSelector(hidden_size=8, vocab_size=512, rank=4, top_k=16)
    logits = rng.normal(size=(3, 512)).astype(np.float32)
    top = np.stack([rng.choice(512, sel.top_k, replace=False) for _ in range(3)])
    for r in range(3):
        logits[r, top[r]] = 5 + rng.random(sel.top_k)
    permuted = logits.copy()
    for r in range(3):
        permuted[r, top[r]] = logits[r, top[r]][::-1]
    ids, scores = sel.candidates(mx.array(logits))
    ids2, _ = sel.candidates(mx.array(permuted))
    assert np.array_equal(np.array(ids), np.sort(top, axis=-1))
    assert np.array_equal(np.array(ids), np.array(ids2))
    # a gather of the same logits, no matmul: exact by construction
    assert np.array_equal(np.array(scores), np.take_along_axis(logits, np.array(ids), axis=-1))


def _rows(n: int, seed: int) -> tuple[mx.array, mx.array]:
    k = mx.random.normal((1, 2, n, 4), key=mx.random.key(seed))
    return k, k * 2 + 1


def test_context_cache_writes_rows_in_place_and_keeps_exactly_what_was_appended():
    """Rows go into buffers grown STEP rows at a time (no copy of the whole context a round);
    what the cache holds is every appended row, as concatenating them would give (copies:
    exact), a block's rows are shown after it but not kept, and trim forgets the last rows."""
    from dflash2_mlx.drafter.attention import ContextCache

    cache, kept = ContextCache(), []
    for i in range(100):
        k, v = _rows(3, i)
        kept.append(k)
        got_k, got_v = cache.append(k, v)
        if i == 0:
            first = cache.buffers[0]
        block_k, _ = cache.with_block(*_rows(4, 1000 + i))
        assert block_k.shape[2] == cache.length + 4
        assert np.array_equal(np.array(block_k[:, :, -4:]), np.array(_rows(4, 1000 + i)[0]))
    assert cache.length == 300 and got_k.shape[2] == 300
    assert cache.buffers[0].shape[2] == 2 * ContextCache.STEP  # grown once, not every round
    assert first.shape[2] == ContextCache.STEP
    whole = mx.concatenate(kept, axis=2)
    assert np.array_equal(np.array(cache.keys), np.array(whole))
    assert np.array_equal(np.array(cache.values), np.array(whole * 2 + 1))
    cache.offset = 300
    cache.trim(5)
    assert (cache.length, cache.offset) == (295, 295)
    k, v = _rows(2, 7)
    cache.append(k, v)  # written over the trimmed rows
    assert np.array_equal(np.array(cache.keys[:, :, -2:]), np.array(k))
    assert np.array_equal(np.array(cache.keys[:, :, :295]), np.array(whole[:, :, :295]))
    cache.compact()
    assert cache.buffers[0].shape[2] == 297
    assert np.array_equal(np.array(cache.keys[:, :, :295]), np.array(whole[:, :, :295]))


def test_windowed_context_cache_keeps_its_last_rows_and_shows_a_block_after_them():
    from dflash2_mlx.drafter.attention import ContextCache

    cache, kept = ContextCache(window=6), []
    for i in range(4):
        k, v = _rows(3, i)
        kept.append(k)
        cache.append(k, v)
    whole = mx.concatenate(kept, axis=2)
    assert cache.length == 5
    assert np.array_equal(np.array(cache.keys), np.array(whole[:, :, -5:]))
    block_k, _ = cache.with_block(*_rows(4, 99))
    assert block_k.shape[2] == 9 and cache.length == 5
    assert np.array_equal(np.array(block_k[:, :, :5]), np.array(whole[:, :, -5:]))
