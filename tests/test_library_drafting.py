"""A library pair drafts as chat and serve do when a generation leaves `block_size` out: this
machine's autotune profile, else the pair's recommended block, else the drafter's trained one."""

from __future__ import annotations

import pytest

import dflash2_mlx as d2
from dflash2_mlx import autotune as A
from tiny import make_drafter, make_target

PROMPT = [5, 9, 2, 7, 11, 3, 8, 1]


def _first_drafter_round(pair, params) -> int:
    """Tokens the first drafter round verified (anchor + drafts)."""
    for ev in pair.stream(PROMPT, params):
        if not ev.prefill and ev.source == "drafter" and ev.drafted:
            return ev.block_size
    raise AssertionError("no drafter round")


def _params(**kw) -> d2.GenerationParams:
    return d2.GenerationParams(max_tokens=24, backoff=False, **kw)


def _store_profile(pair, target, drafter, **fields) -> None:
    key = A.profile_key(pair, str(target), str(drafter))
    A.save_profile({"schema": A.SCHEMA, "key": key, **fields})


def test_a_pair_of_models_drafts_at_the_trained_block(dflash2_home):
    pair = d2.Pair.from_models(make_target("llama"), None, make_drafter(2, block_size=8))
    assert pair.drafting.block is None
    assert _first_drafter_round(pair, _params()) == 8


def test_load_pair_drafts_at_this_machines_profile(tiny_pair, dflash2_home):
    target, drafter = tiny_pair
    pair = d2.load_pair(target, drafter)
    trained = pair.drafter.config.block_size
    assert pair.drafting.block == trained  # no profile, no alias: the trained block
    assert pair.width_cost is None  # no profile: the batch's default model
    table = {"ms": {"1": {"1": 10.0, "4": 14.0}, "2": {"1": 12.0, "4": 20.0}}}
    _store_profile(pair, target, drafter, chosen_block=3, chosen_lookup_block=6, batch_verify=table)
    pair = d2.load_pair(target, drafter)  # as `dflash2 chat --target T --drafter D` reads it
    assert (pair.drafting.block, pair.drafting.lookup_block) == (3, 6)
    assert pair.width_cost(2, 4) == 20.0 and pair.batch().widths.cost is pair.width_cost
    own = d2.load_pair(target, drafter, resolve_drafting=False)  # a caller resolving its own
    assert own.drafting.block is None and own.width_cost is None
    assert _first_drafter_round(pair, _params()) == 3
    filled = pair.with_defaults(_params())
    assert (filled.block_size, filled.lookup_block) == (3, 6)
    from dflash2_mlx.serve.app import create_app

    app = create_app(pair, model_name="m")  # a server the library starts drafts alike
    assert app.state.settings.drafting == pair.drafting
    from dflash2_mlx.settings import Drafting

    trained_app = create_app(pair, model_name="m", drafting=Drafting())  # no block: the trained
    fields = trained_app.state.settings.drafting_fields(d2.SamplingParams())
    assert fields["block_size"] == trained  # in every request: not pair.drafting's 3


def test_what_a_generation_gives_is_kept(tiny_pair, dflash2_home):
    target, drafter = tiny_pair
    pair = d2.load_pair(target, drafter)
    _store_profile(pair, target, drafter, chosen_block=3, chosen_lookup_block=6)
    pair = d2.load_pair(target, drafter)
    trained = pair.drafter.config.block_size
    assert _first_drafter_round(pair, _params(block_size=2)) == 2
    own = pair.with_defaults(_params(lookup_block=9))
    assert (own.block_size, own.lookup_block) == (3, 9)
    schedule = ((4, 2),)  # a schedule given: the pair's block, the caller's schedule
    kept = pair.with_defaults(_params(block_by_context=schedule))
    assert (kept.block_size, kept.block_by_context, kept.lookup_block) == (3, schedule, 6)
    assert _first_drafter_round(pair, _params(block_by_context=((10_000, 2),))) == 3
    later = _params(block_by_context=((4, trained),))  # from 4 tokens of context: its block
    assert _first_drafter_round(pair, later) == trained
    assert pair.with_defaults(_params(block_size=3)).lookup_block is None  # a block: no default
    plain = pair.with_defaults(_params(speculative=False))
    assert (plain.block_size, plain.lookup_block) == (None, None)


@pytest.mark.real_model
def test_the_embedded_pair_drafts_at_its_recommended_block(monkeypatch, tmp_path):
    """`chat`, `serve` and `bench` run smollm2-135m at the alias's block 4 where no profile
    was measured: so does the library, which drafted at the trained 8 before."""
    from dflash2_mlx.registry import resolve
    from dflash2_mlx.settings import EngineFlags, resolve_engine

    def default_drafting(pair, resolved):
        return resolve_engine(EngineFlags(), pair, resolved, None).drafting

    pair = d2.load_pair("smollm2-135m", offline=True)
    resolved = resolve("smollm2-135m", offline=True)
    again = default_drafting(pair, resolved)  # this machine's, profile or not
    same = ("speculative", "block", "by_context", "by_temperature", "lookup_block")
    assert all(getattr(pair.drafting, f) == getattr(again, f) for f in same)
    assert (pair.drafting.verify_cost is None) == (again.verify_cost is None)  # a new closure
    monkeypatch.setenv("DFLASH2_HOME", str(tmp_path))  # no profile
    drafting = default_drafting(pair, resolved)
    assert drafting.block == resolved.block_size < pair.drafter.config.block_size
    pair.drafting = drafting
    assert pair.with_defaults(d2.GenerationParams()).block_size == resolved.block_size


def test_bad_library_arguments_name_the_field(tiny_pair):
    target, drafter = tiny_pair
    for bad in (None, 123, ["smollm2-135m"]):
        with pytest.raises(d2.ParameterError, match="target must be a folder"):
            d2.load_pair(bad)
    with pytest.raises(d2.ParameterError, match="drafter must be a folder"):
        d2.load_pair(target, 123)
    pair = d2.load_pair(target, drafter)
    pair.drafting = {"block": 4}
    with pytest.raises(d2.ParameterError, match="pair.drafting must be a"):
        pair.with_defaults(_params())
    with pytest.raises(d2.ParameterError, match="verify_cost must take"):
        _params(block_by_context=((8, 2),), verify_cost=lambda: 1.0)
    with pytest.raises(d2.ParameterError, match=r"verify_cost\(1, 1\) raised IndexError"):
        _params(block_by_context=((8, 2),), verify_cost=lambda c, w: [][c])
    with pytest.raises(d2.ParameterError, match="must return ms >= 0, got 'x'"):
        _params(block_by_context=((8, 2),), verify_cost=lambda c, w: "x")
    import numpy as np

    ok = _params(block_by_context=((np.int64(8), np.int64(2)),))  # as max_tokens takes them
    assert ok.block_by_context == ((8, 2),) and type(ok.block_by_context[0][0]) is int
    with pytest.raises(d2.ParameterError, match="top must be None or an int"):
        pair.prompt_logprobs(PROMPT, top=-1)
