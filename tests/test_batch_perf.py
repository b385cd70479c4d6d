"""The batched engine's speed parts: one drafter pass for several rows (drafter/batch.py),
the per-round width cap (engine/width.py) and its measured cost table (bench/batch_costs),
and a lone row on the single engine's round. Batched == alone for whole generations is
tests/test_batch.py."""

import copy

import mlx.core as mx
import numpy as np
import pytest
import tiny

from dflash2_mlx import GenerationParams, SamplingParams, SpeculativeDecoder
from dflash2_mlx.drafter.batch import DraftRequest, batchable, draft_rows
from dflash2_mlx.engine.batch import BatchDecoder
from dflash2_mlx.engine.proposal import Proposal
from dflash2_mlx.engine.width import (
    WidthRule,
    choose_width,
    default_cost,
    expected_committed,
    shorten,
)
from dflash2_mlx.batch_costs import table_cost
from dflash2_mlx.target.adapter import TargetAdapter


# ----------------------------------------------------------------------------- width cap
def test_expected_committed_is_the_geometric_sum():
    assert expected_committed(0.5, 0) == 1.0
    assert expected_committed(0.5, 3) == pytest.approx(1.875)
    assert expected_committed(1.0, 7) == 8.0


def test_one_long_proposal_is_cut_when_width_is_costly():
    lengths, probs = [7, 7, 7, 15], [0.6, 0.6, 0.6, 0.6]
    flat = lambda rows, width: 1.0  # noqa: E731  (a free width: verify everything)
    assert choose_width(lengths, probs, flat) == 16
    steep = lambda rows, width: rows * width  # noqa: E731  (cost grows with every token)
    assert choose_width(lengths, probs, steep) < 16
    # the default model: at 4 rows, 12 extra positions of a p=0.6 tail are not worth it, nor 4
    assert choose_width(lengths, probs, default_cost) == 4
    # equal rows: the autotuned single-row block is cut where acceptance is low and rows many
    table = table_cost({4: {1: 103.5, 2: 118.6, 4: 149.0, 8: 230.5}})  # ms, this project's CPU
    assert choose_width([7] * 4, [0.4] * 4, table) == 2
    assert choose_width([7] * 4, [0.9] * 4, table) == 8
    # ... but a lookup run that is almost always right is
    assert choose_width(lengths, [0.6, 0.6, 0.6, 0.99], lambda r, w: 1 + r * w / 200) == 16


def test_table_cost_interpolates_widths_then_rows():
    table = {1: {1: 10.0, 8: 17.0}, 4: {1: 20.0, 8: 48.0}}
    cost = table_cost(table)
    assert cost(1, 8) == 17.0 and cost(4, 1) == 20.0
    assert cost(1, 4) == pytest.approx(13.0)  # between widths 1 and 8
    assert cost(2, 1) == pytest.approx(10.0 + 10.0 / 3)
    assert cost(2, 8) == pytest.approx(17.0 + (48.0 - 17.0) / 3)  # between rows 1 and 4
    assert cost(8, 8) == pytest.approx(48.0 + (48.0 - 17.0) / 3 * 4)  # along the last two


def test_shorten_keeps_each_drafts_distribution():
    q = mx.arange(12, dtype=mx.float32).reshape(4, 3)
    cand = mx.arange(12).reshape(4, 3)
    p = Proposal([5, 6, 7, 8], q, cand, "drafter")
    s = shorten(p, 2)
    assert s.drafts == [5, 6] and s.source == "drafter"
    assert s.q.tolist() == q[:2].tolist() and s.candidates.tolist() == cand[:2].tolist()
    assert shorten(p, 9) is p
    point = shorten(Proposal.point_mass([1, 2, 3], "lookup"), 1)
    assert point.drafts == [1] and point.q.shape == (1, 1) and point.candidates.tolist() == [[1]]


def test_width_rule_learns_rates_and_caps_costly_rounds():
    rule = WidthRule(cost=lambda rows, width: rows * width)
    assert rule.rate("lookup") == 0.5
    rule.observe("lookup", 6, 6)  # all accepted: no rejection
    rule.observe("lookup", 6, 2)
    assert rule.rate("lookup") == pytest.approx((8 + 1) / (8 + 1 + 2))
    rule.observe("drafter", 0, 0)  # nothing drafted: nothing learned
    assert "drafter" not in rule.accepted
    same = [Proposal.point_mass([1, 2, 3], "lookup"), Proposal.point_mass([4, 5, 6], "lookup")]
    cheap = WidthRule(cost=lambda rows, width: 1.0)  # width is free: nothing is cut
    assert [p.drafts for p in cheap.cap(same, [False, False])] == [[1, 2, 3], [4, 5, 6]]
    # rows of one length are cut too when their width costs more than their drafts bring
    # (here every token verified costs as much as one more committed: nothing is drafted)
    assert [p.drafts for p in rule.cap(same, [False, False])] == [[], []]
    assert [p.drafts for p in rule.cap(same, [True, False])] == [[1, 2, 3], [4, 5, 6]]
    padding_only = WidthRule(cost=rule.cost, cut_uniform=False)  # a GPU without a measured table
    assert [p.drafts for p in padding_only.cap(same, [False, False])] == [[1, 2, 3], [4, 5, 6]]
    ragged = [Proposal.point_mass([1], "drafter"), Proposal.point_mass(list(range(15)), "lookup")]
    rule.cost = lambda rows, width: rows * (4 + width)  # a fixed part: some drafts pay
    capped = rule.cap(ragged, [False, False])
    assert capped[0].drafts == [1] and 1 < len(capped[1].drafts) < 15
    # a sampled (fixed) row is never cut, and the round is as wide as it anyway
    assert [len(p.drafts) for p in rule.cap(ragged, [False, True])] == [1, 15]
    assert choose_width([1, 15], [0.5, 0.5], rule.cost, floor=10) >= 10


def test_capped_batched_rounds_stay_exact():
    """A width rule that cuts hard changes how rounds are cut, never what is committed."""
    model = tiny.make_target("qwen3", seed=4)
    drafter = tiny.make_drafter(2, block_size=6)
    dec = SpeculativeDecoder(
        TargetAdapter(model, drafter.config.target_layer_ids), drafter, lookup=2
    )
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [9, 8, 7], [4, 5, 4, 5, 4, 5], [30, 31]]
    params = GenerationParams(max_tokens=20)
    alone = [dec.generate(p, params) for p in prompts]
    batch = BatchDecoder(dec, max_batch=4)
    cuts = []

    class Spy(WidthRule):
        def cap(self, proposals, fixed):
            out = super().cap(proposals, fixed)
            cuts.extend(len(a.drafts) - len(b.drafts) for a, b in zip(proposals, out))
            return out

    batch.widths = Spy(cost=lambda rows, width: rows * width * width)
    out: list[list[int]] = [[] for _ in prompts]
    for i, ev in batch.stream((p, params) for p in prompts):
        out[i].extend(ev.tokens)
    assert out == alone
    assert max(cuts) > 0  # some proposals really were cut


# ----------------------------------------------------------------------------- batched drafter
def _bound(version: int):
    model = tiny.make_target("llama", seed=5)
    drafter = tiny.make_drafter(version, block_size=8, seed=6)
    adapter = TargetAdapter(model, drafter.config.target_layer_ids)
    drafter.bind(adapter.binding())
    return adapter, drafter


def _rows(adapter, drafter, prompts, fresh):
    """Per row: a drafter cache warmed on its prompt's features and `fresh` new feature rows."""
    out = []
    for prompt, n in zip(prompts, fresh):
        fwd = adapter.forward(mx.array([prompt]), None)
        cache = drafter.make_cache()
        seen = len(prompt) - n
        drafter.hidden(mx.array([[prompt[0]]]), fwd.features[:, :seen], cache)
        mx.eval([c.state for c in cache])
        out.append((prompt[-1], fwd.features[:, seen:], cache))
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_batched_drafter_agrees_with_per_row_drafts(version):
    adapter, drafter = _bound(version)
    assert batchable(drafter)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [11, 12, 13], list(range(20, 40)), [7, 7, 8]]
    rows = _rows(adapter, drafter, prompts, fresh=[2, 1, 5, 2])
    sp = SamplingParams(temperature=1.0) if version == 1 else SamplingParams()
    keys = [mx.random.key(k) for k in range(len(rows))]
    lengths = [8, 8, 8, 5]  # two lengths: two groups
    mk = lambda: [  # noqa: E731
        DraftRequest(a, n, f, copy.deepcopy(c), sp, k)
        for (a, f, c), n, k in zip(rows, lengths, keys)
    ]
    together, alone = mk(), mk()
    batched = draft_rows(drafter, together)
    single = [
        drafter.draft_block(r.anchor, r.length, r.features, r.cache, r.sampling, r.key)
        for r in alone
    ]
    for b, s, rt, ra, n in zip(batched, single, together, alone, lengths):
        assert b.tokens.shape == s.tokens.shape == (n - 1,)
        for ct, ca in zip(rt.cache, ra.cache):  # each row's cache grew by its own rows
            assert ct.offset == ca.offset and ct.length == ca.length
            np.testing.assert_allclose(np.array(ct.keys), np.array(ca.keys), atol=1e-4)
        if version == 1:  # the full distributions the drafts were drawn from
            np.testing.assert_allclose(np.array(b.q), np.array(s.q), atol=1e-5)
        else:  # candidates are a top-K set: compare them as sets, row by row
            agree = [set(x) == set(y) for x, y in zip(b.candidates.tolist(), s.candidates.tolist())]
            assert sum(agree) >= len(agree) - 1, agree


def test_drafter_with_windowed_layers_drafts_row_by_row():
    drafter = tiny.make_drafter(
        2, layer_types=["sliding_attention", "full_attention"], sliding_window=4
    )
    assert not batchable(drafter)


# ----------------------------------------------------------------------------- one row alone
@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_row_alone_runs_the_single_engine_then_rejoins_the_batch(family):
    """A lone row leaves the batch cache for plain caches (the single engine's round); a
    request joining it merges it back in front; both equal their runs alone."""
    model = tiny.make_target(family, seed=8)
    drafter = tiny.make_drafter(2, block_size=4)
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    params = GenerationParams(max_tokens=18)
    prompts = [[1, 2, 3, 4], [9, 8, 7, 6, 5]]
    alone = [dec.generate(p, params) for p in prompts]
    batch = BatchDecoder(dec, max_batch=2)
    ids = {batch.add(prompts[0], params): 0}
    out: list[list[int]] = [[], []]
    for _ in range(3):  # the first request runs alone: plain caches, no batch cache
        for rid, ev in batch.step():
            out[ids[rid]].extend(ev.tokens)
    assert batch.cache is None and batch.rows[0].session.target_cache
    ids[batch.add(prompts[1], params)] = 1
    sizes = set()
    while batch.busy:
        for rid, ev in batch.step():
            out[ids[rid]].extend(ev.tokens)
            sizes.add(ev.batch_size)
    assert out == alone
    assert 2 in sizes


# ----------------------------------------------------------------------------- measured costs
@pytest.fixture
def enough_rounds(monkeypatch):
    """These autotune runs have no prompts (the costs are what is tested): their empty
    calibration counts as enough drafter rounds to choose by."""
    from dflash2_mlx import autotune as A

    calibrate = A.calibrate
    monkeypatch.setattr(A, "calibrate", lambda *a, **k: {**calibrate(*a, **k), "rounds": 100})


@pytest.mark.usefixtures("dflash2_home", "enough_rounds")
@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_batch_verify_costs_are_stored_and_read_back(family, steady_timings):
    import dflash2_mlx as d2
    from dflash2_mlx import autotune as A
    from dflash2_mlx.autotune import BATCH_WIDTHS as WIDTHS
    from dflash2_mlx.batch_costs import width_costs
    from dflash2_mlx.costs import batch_verify_costs

    pair = d2.Pair.from_models(tiny.make_target(family), None, tiny.make_drafter(2, block_size=4))
    costs = batch_verify_costs(pair, [1, 2, 3], [1, 4], context=24, repeats=1)
    assert sorted(costs["ms"]) == [1, 2, 3]
    assert all(sorted(row) == [1, 4] and min(row.values()) > 0 for row in costs["ms"].values())
    profile = A.autotune(pair, [], target="t", drafter="d", batches=(2,), repeats=1, context=16)
    assert sorted(profile["batch_verify"]["ms"]) == ["2"]
    measured = sorted(int(w) for w in profile["batch_verify"]["ms"]["2"])
    assert measured == list(WIDTHS)  # lookup on: widths up to the lookup candidates
    cost = width_costs(profile)
    assert cost(2, 4) == pytest.approx(profile["batch_verify"]["ms"]["2"]["4"])
    assert cost(1, 2) == pytest.approx(profile["verify"]["ms"]["2"])  # one row: the single table
    assert width_costs({"verify": {"ms": {"1": 3.0}}}) is None  # no batched table: default rule
    assert width_costs({"batch_verify": {"ms": {"2": {"x": 1}}}}) is None  # damaged: ignored


@pytest.mark.usefixtures("dflash2_home", "enough_rounds")
def test_the_profiles_width_cost_reaches_every_batched_front_end(steady_timings):
    """A stored profile's cost(rows, width) is what the library's, bench's and the server's
    batched rounds use; without one they use the default model."""
    import dflash2_mlx as d2
    from dflash2_mlx import autotune as A
    from dflash2_mlx.profiles import profile_advice
    from dflash2_mlx.engine.width import default_cost
    from dflash2_mlx.profiles import save_profile
    from dflash2_mlx.serve import create_app
    from test_serve import make_tokenizer

    target, drafter = tiny.make_target("llama"), tiny.make_drafter(2, block_size=4)
    pair = d2.Pair.from_models(target, make_tokenizer(), drafter)
    assert profile_advice(pair, "t", "d").width_cost is None
    assert pair.batch(2).widths.cost is default_cost
    save_profile(A.autotune(pair, [], target="t", drafter="d", batches=(2,), repeats=1, context=16))
    cost = profile_advice(pair, "t", "d").width_cost
    assert cost is not None and cost(2, 4) > 0
    assert pair.batch(2, cost).widths.cost is cost
    app = create_app(pair, model_name="tiny", max_batch=2, width_cost=cost)
    assert app.state.worker.scheduler.batch.widths.cost is cost
