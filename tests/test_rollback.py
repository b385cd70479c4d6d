"""Exact rollback of recurrent (Gated-DeltaNet) target caches."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import tiny

from dflash2_mlx.target import gdn
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.target.capture import snapshot_state


def _gdn_layers(model):
    return [layer for layer in model.language_model.model.layers if layer.is_linear]


def test_mirror_equals_mlx_lm_gated_deltanet():
    """The recording mirror computes exactly what mlx-lm's own module computes."""
    model = tiny.make_target("qwen3_5")
    layer = _gdn_layers(model)[0]
    assert gdn.supports(layer.linear_attn)
    cache_a, cache_b = model.make_cache()[0], model.make_cache()[0]
    x = mx.random.normal((1, 5, tiny.HIDDEN))
    for step in (x, x[:, :3] * 0.5):
        ref = layer.linear_attn(step, None, cache_a)
        got = gdn.forward(layer.linear_attn, step, None, cache_b, [])
        np.testing.assert_array_equal(np.array(ref), np.array(got))
        for s_a, s_b in zip(cache_a.cache, cache_b.cache):
            np.testing.assert_array_equal(np.array(s_a), np.array(s_b))


@pytest.mark.parametrize("keep", [1, 2, 4, 6])
def test_rollback_equals_feeding_only_the_kept_rows(keep):
    model = tiny.make_target("qwen3_5")
    adapter = TargetAdapter(model, (0, 1))
    prompt = mx.array([[3, 14, 15, 9, 26, 5]])
    block = mx.array([[7, 8, 9, 10, 11, 12]])
    ours, ref = adapter.make_cache(), adapter.make_cache()
    adapter.prefill(prompt, ours)
    adapter.prefill(prompt, ref)
    fwd = adapter.forward(block, ours)
    assert len(fwd.capture.gdn) == len(_gdn_layers(model)) and not fwd.capture.replays
    adapter.rollback(ours, fwd, keep, block.shape[1])
    adapter.forward(block[:, :keep], ref)
    for c_ours, c_ref in zip(ours, ref):
        for a, b in zip(snapshot_state(c_ours), snapshot_state(c_ref)):
            if isinstance(a, list):
                for x, y in zip(a, b):
                    np.testing.assert_allclose(np.array(x), np.array(y), rtol=1e-5, atol=1e-5)
    # The next forward sees identical logits either way.
    nxt = mx.array([[40]])
    np.testing.assert_allclose(
        np.array(adapter.forward(nxt, ours).logits),
        np.array(adapter.forward(nxt, ref).logits),
        rtol=1e-4,
        atol=1e-4,
    )


def test_mixer_is_restored_after_each_call():
    model = tiny.make_target("qwen3_5")
    adapter = TargetAdapter(model, (0, 1))
    cache = adapter.make_cache()
    adapter.forward(mx.array([[1, 2, 3]]), cache)
    for layer in _gdn_layers(model):
        assert "linear_attn" not in vars(layer)
        assert type(layer.linear_attn).__name__ == "GatedDeltaNet"


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_another_thread_goes_through_the_proxies_unrecorded(family):
    """Plain mlx-lm on the same model in another thread while a forward is tapped (an app
    comparing against it, say) goes straight through to the layers: nothing of it lands in
    the capture (it once did: crashes and wrong tokens), and its logits are the model's."""
    import threading

    from mlx_lm.models.cache import make_prompt_cache

    from dflash2_mlx.target.capture import tapped

    model = tiny.make_target(family)
    adapter = TargetAdapter(model, (0, 1))
    ids = mx.array([[1, 2, 3, 4]])
    alone = np.array(model(ids, cache=make_prompt_cache(model)))
    out = {}

    def plain():
        out["logits"] = np.array(model(ids, cache=make_prompt_cache(model)))

    with tapped(adapter.layers, {0, 1}, adapter._recurrent(adapter.make_cache())) as cap:
        thread = threading.Thread(target=plain)
        thread.start()
        thread.join()
    assert not cap.features and not cap.replays and not cap.gdn
    np.testing.assert_allclose(out["logits"], alone, rtol=1e-5, atol=1e-5)  # the model's own


def test_generic_layer_replay_is_exact_too(monkeypatch):
    """Recurrent layers without the fast path are replayed whole; still lossless."""
    from dflash2_mlx import GenerationParams, SpeculativeDecoder

    monkeypatch.setattr(gdn, "supports", lambda mixer: False)
    model = tiny.make_target("qwen3_5")
    drafter = tiny.fit_drafter(
        model, tiny.make_drafter(1, block_size=6), [[3, 14, 15, 9, 26], [5, 35, 8, 9]], steps=60
    )
    dec = SpeculativeDecoder(TargetAdapter(model, drafter.config.target_layer_ids), drafter)
    cache = dec.target.make_cache()
    fwd = dec.target.forward(mx.array([[1, 2, 3]]), cache)
    assert fwd.capture.replays and not fwd.capture.gdn
    for prompt in ([3, 14, 15, 9, 26], [5, 35, 8, 9]):
        assert dec.generate(
            prompt, GenerationParams(max_tokens=24, block_size=6)
        ) == tiny.greedy_reference(model, prompt, 24)


@pytest.mark.parametrize("tied", [True, False])
def test_transposed_head_equals_the_stored_layout_to_rounding(tied):
    """A pre-transposed copy of the head gives the model's own logits up to float rounding
    (not bit for bit: the layouts take different BLAS paths; OpenBLAS's SkylakeX kernels
    differ by 1 ulp where its Haswell/Zen kernels agree). A tiny head is used as stored."""
    from dflash2_mlx.target.head import TransposedHead

    model = tiny.make_target("llama", tie_word_embeddings=tied)
    adapter = TargetAdapter(model, (0, 2))
    assert not isinstance(adapter.head, TransposedHead)  # below MIN_TIMED_ELEMENTS
    weight = adapter.inner.embed_tokens.weight if tied else model.lm_head.weight
    adapter.head = TransposedHead(weight)
    for ids in ([[3, 1, 4]], [[1, 5, 9, 2, 6, 5, 3, 5, 8]]):
        got = adapter.forward(mx.array(ids), adapter.make_cache()).logits
        want = model(mx.array(ids), cache=adapter.make_cache())
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stored_ms, copied_ms, pays", [(40.0, 20.0, True), (20.0, 40.0, False)])
def test_head_layout_is_timed_once_and_kept_only_when_faster(
    monkeypatch, stored_ms, copied_ms, pays
):
    """cpu_head keeps a transposed copy only where it beat the stored layout by MIN_GAIN on
    this BLAS (the timings are faked here: a real one decides per machine), once per shape."""
    from dflash2_mlx.target import head as heads

    monkeypatch.setattr(heads, "MIN_TIMED_ELEMENTS", 0)
    monkeypatch.setattr(heads, "_PAYS", {})
    calls = []

    def fake(fn, reps):
        calls.append(reps)
        fn()
        copied = "weight_t" in fn.__code__.co_freevars  # the closure over the copy
        return (copied_ms if copied else stored_ms) if reps > 1 else 0.0

    monkeypatch.setattr(heads, "_median_s", fake)
    device = mx.default_device()
    mx.set_default_device(mx.cpu)  # the layout question is the CPU's
    try:
        linear = nn.Linear(32, 300, bias=False)
        head = heads.cpu_head(linear)
        again = heads.cpu_head(nn.Linear(32, 300, bias=False))
    finally:
        mx.set_default_device(device)
    assert isinstance(head, heads.TransposedHead) == pays
    if pays:
        assert mx.array_equal(head.weight_t, linear.weight.T).item()  # a memory copy, no matmul
    assert isinstance(again, heads.TransposedHead) == pays  # same shape: decided once
    assert sorted(calls) == [1, 1, 3, 3]


def test_a_transposed_head_follows_new_weights_of_its_model(monkeypatch):
    """Where the CPU keeps a transposed copy of the head, weights given to the model after
    the pair was made (an adapter swapped in: `update`, `load_weights`) reach the verify: the
    copy went stale and the output was no longer the model's."""
    from test_serve import make_tokenizer

    from dflash2_mlx.api import Pair
    from dflash2_mlx.engine.generation import GenerationParams
    from dflash2_mlx.target import head as heads

    def copy_is_faster(fn, reps):
        return 1.0 if "weight_t" in fn.__code__.co_freevars else 2.0

    monkeypatch.setattr(heads, "MIN_TIMED_ELEMENTS", 0)
    monkeypatch.setattr(heads, "_PAYS", {})
    monkeypatch.setattr(heads, "_median_s", copy_is_faster)
    device = mx.default_device()
    mx.set_default_device(mx.cpu)  # the layout question is the CPU's
    try:
        model = tiny.make_target("llama", tie_word_embeddings=False)
        pair = Pair.from_models(model, make_tokenizer(), tiny.make_drafter(2, block_size=4))
        assert isinstance(pair.decoder.target.head, heads.TransposedHead)
        prompt = [3, 1, 4, 1, 5]
        w = model.lm_head.weight
        model.update({"lm_head": {"weight": mx.concatenate([w[1:], w[:1]])}})  # rows rolled
        out, _ = pair.generate(prompt, GenerationParams(max_tokens=12))
    finally:
        mx.set_default_device(device)
    assert out == tiny.greedy_reference(model, prompt, 12, eos=set(pair.eos_ids))
