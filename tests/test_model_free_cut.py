"""Long contexts: a greedy round's lookup, prediction or datastore proposal is cut to what its
source's acceptance in the generation so far pays for, at the profile's verify cost there
(GenerationParams.verify_cost), from block_by_context's first context on; the output never
changes, and nothing is cut without both, below that context, for sampled requests or for a
grammar's forced text."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import pytest
import tiny

import dflash2_mlx as d2
from dflash2_mlx.batch_costs import context_costs
from dflash2_mlx.engine.generation import _Run
from dflash2_mlx.engine.proposal import Proposal
from dflash2_mlx.engine.width import cut_to_rate
from dflash2_mlx.errors import ParameterError


def _run(params: d2.GenerationParams) -> _Run:
    return _Run(params, 4, 12, mx.random.key(0))


def test_the_cut_is_the_width_the_rate_pays_for():
    p = Proposal.point_mass(list(range(10, 21)), "lookup")
    flat = lambda width: 1.0  # noqa: E731 - any width costs one forward: nothing is cut
    assert cut_to_rate(p, 0.3, flat).drafts == p.drafts
    assert cut_to_rate(p, 0.5, lambda w: 1.0 + w).drafts == p.drafts[:1]
    assert cut_to_rate(p, 0.99, lambda w: 1.0 + w / 20).drafts == p.drafts  # sure: all of it
    assert cut_to_rate(p, 0.0, lambda w: 1.0 + w).drafts == []


def test_where_and_for_whom_proposals_are_cut():
    look = Proposal.point_mass(list(range(10, 21)), "lookup")
    params = d2.GenerationParams(block_by_context=((100, 2),), verify_cost=lambda c, w: 1.0 + w)
    assert _run(params).cut_model_free(look, 100).drafts == look.drafts[:1]  # prior rate 0.5
    assert _run(params).cut_model_free(look, 99).drafts == look.drafts  # before the schedule
    for other in (
        replace(params, verify_cost=None),
        replace(params, sampling=d2.SamplingParams(temperature=0.8)),
    ):
        assert _run(other).cut_model_free(look, 500).drafts == look.drafts
    forced = Proposal.point_mass(look.drafts, "grammar")
    assert _run(params).cut_model_free(forced, 500).drafts == forced.drafts
    run = _run(params)
    for _ in range(20):  # this generation's lookups were all accepted: they run long again
        run.rates.observe("lookup", 5, 5)
    assert run.cut_model_free(look, 500).drafts == look.drafts
    with pytest.raises(ParameterError, match="verify_cost must be a callable or None"):
        d2.GenerationParams(verify_cost=3)
    with pytest.raises(ParameterError, match="verify_cost has no effect with speculative=False"):
        d2.GenerationParams(speculative=False, verify_cost=lambda c, w: 1.0)
    with pytest.raises(ParameterError, match="from block_by_context's first context on"):
        replace(params, block_by_context=())  # it would do nothing: refused, not ignored


def test_the_engine_cuts_lookup_rounds_at_long_contexts_output_unchanged():
    pair = d2.Pair.from_models(tiny.make_target("llama", seed=3), None, tiny.make_drafter(2, 4))
    prompt = list(range(5, 17)) * 4  # repeats: context lookup proposes
    base = d2.GenerationParams(max_tokens=48, block_size=4, lookup_block=12)
    plain = pair.generate(
        prompt, replace(base, speculative=False, block_size=None, lookup_block=None)
    )[0]

    def widths(params):
        events = list(pair.stream(prompt, params))
        out = [t for ev in events for t in ev.tokens]
        looked = [ev.block_size for ev in events if ev.source == "lookup"]
        return out, looked

    out, uncut = widths(base)
    assert out == plain and uncut and max(uncut) > 2  # lookups ran long
    cut = replace(base, block_by_context=((1, 4),), verify_cost=lambda c, w: 1.0 + w)
    out, looked = widths(cut)
    assert out == plain and looked and min(looked) < max(uncut)
    later = replace(cut, block_by_context=((10**6, 4),))  # never that long: never cut
    assert widths(later) == (plain, uncut)
    # a width no rate pays for: a drafter round instead (not a one-token round, which would
    # also stop its source's rate from learning)
    dear = replace(cut, verify_cost=lambda c, w: 1.0 + 100.0 * (w - 1))
    events = list(pair.stream(prompt, dear))
    assert [t for ev in events for t in ev.tokens] == plain
    rounds = [ev for ev in events if not ev.prefill]
    assert {ev.source for ev in rounds} == {"drafter"}
    assert rounds[0].block_size == 4  # the drafter's block (max_tokens narrows the last ones)


def test_the_profile_gives_one_sequences_cost_by_context_and_width():
    profile = {
        "verify": {"context": 256, "ms": {"1": 10.0, "4": 13.0}},
        "lookup": {"verify_ms": {"1": 10.0, "4": 13.0, "12": 19.0}},
        "long_context": {"context": 2048, "verify_ms": {"1": 20.0, "4": 30.0}},
    }
    cost = context_costs(profile)
    assert cost(256, 4) == pytest.approx(13.0) and cost(2048, 4) == pytest.approx(30.0)
    assert cost(1152, 1) == pytest.approx(15.0)  # halfway: linear in the context
    assert cost(256, 12) == pytest.approx(19.0) and cost(2048, 12) > cost(2048, 4)
    assert context_costs({**profile, "long_context": None}) is None  # made before: none
    assert context_costs(None) is None
    # widths past the long context's measured ones follow the short context's shape; an odd
    # width timed above the next even one makes no width cheaper than a narrower one
    assert cost(2048, 12) == pytest.approx(30.0 * 19.0 / 13.0)
    odd = {**profile, "verify": {"context": 256, "ms": {"1": 10.0, "3": 14.0, "4": 13.0}}}
    odd["lookup"] = None
    assert context_costs(odd)(256, 4) == pytest.approx(14.0)
