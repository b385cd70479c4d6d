"""Drafter training: the batched training forward, the objective, checkpoints and features."""

import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import tiny

from dflash2_mlx import load_drafter
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.train.features import (
    FeatureCacheError, Sequence_, StoredSequence, build_feature_cache, load_feature_cache,
)
from dflash2_mlx.train.objective import Blocks, block_hidden
from dflash2_mlx.train.trainer import TrainConfig, Trainer, drafter_config_for, init_drafter

TARGET_CFG = {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "head_dim": 16}
PROMPTS = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9], [2, 7, 1, 8, 2, 8], [60, 61, 62],
           [11, 12, 13], [40, 41]]


@pytest.fixture(scope="module")
def target():
    return tiny.make_target("llama")


@pytest.fixture(scope="module")
def sequences(target):
    adapter = TargetAdapter(target, (0, 2))
    out = []
    for i, p in enumerate(PROMPTS):
        toks = p + tiny.greedy_reference(target, p, 40)
        f = np.array(adapter.forward(mx.array([toks]), None).features[0].astype(mx.float16))
        out.append(StoredSequence(f"s{i}", 0.0, np.array(toks, dtype=np.int32), len(p), f))
    return out


@pytest.mark.parametrize("version,kw", [
    (1, {}), (2, {}), (1, {"is_causal": True}),
    (2, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6}),
])
def test_training_forward_equals_inference_forward(target, version, kw):
    d = tiny.make_drafter(version, block_size=8, **kw)
    adapter = TargetAdapter(target, d.config.target_layer_ids)
    d.bind(adapter.binding())
    seq = list(range(3, 40))
    feats = adapter.forward(mx.array([seq]), None).features
    anchors = [5, 11, 20]
    ids = mx.array([[seq[a]] + [d.config.mask_token_id] * 7 for a in anchors])
    h = block_hidden(d, Blocks(feats, mx.array(anchors), ids, mx.zeros((3, 7), dtype=mx.int32)))
    for j, a in enumerate(anchors):
        ref = d.hidden(ids[j:j + 1], feats[:, :a], d.make_cache())[0]
        np.testing.assert_allclose(np.array(h[j]), np.array(ref), atol=1e-4)


def _trainer(target, sequences, out: Path, version=2, steps=40):
    cfg = TrainConfig(version=version, layers=2, block_size=8, target_layer_ids=(0, 2),
                      mask_token_id=95, steps=steps, batch_seqs=3, anchors_per_seq=8,
                      eval_every=steps, checkpoint_every=10, lr=3e-3, negatives=16,
                      selector_rank=8)
    adapter = TargetAdapter(target, (0, 2))
    d = init_drafter(drafter_config_for(adapter, TARGET_CFG, cfg), cfg)
    return Trainer(adapter, d, sequences, sequences, cfg, out, log=lambda s: None)


@pytest.mark.parametrize("version", [1, 2])
def test_tiny_training_run_lowers_the_loss(target, sequences, tmp_path, version):
    tr = _trainer(target, sequences, tmp_path, version)
    losses = []
    final = tr.run(on_step=lambda r: losses.append(r["loss"]))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
    assert final["proxy_tau"] > 1.5


def test_export_reloads_and_drafts_identically(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path / "run", steps=12)
    tr.run()
    out = tr.export(tmp_path / "drafter", dtype=mx.float32, card="# card\n")
    reloaded = load_drafter(out)
    adapter = TargetAdapter(target, (0, 2))
    reloaded.bind(adapter.binding())
    s = sequences[0]
    feats = mx.array(s.features.astype(np.float32))[None]
    block = mx.array([[int(s.tokens[9])] + [95] * 7])
    trained = tr.drafter.hidden(block, feats[:, :9] * tr.scale, tr.drafter.make_cache())
    loaded = reloaded.hidden(block, feats[:, :9], reloaded.make_cache())
    np.testing.assert_allclose(np.array(trained), np.array(loaded), atol=1e-4)
    hid = loaded[0, 1:]
    assert reloaded.select(hid, reloaded.logits(hid), mx.array(5), 0.0).tokens.tolist() == \
        tr.drafter.select(trained[0, 1:], tr.drafter.logits(trained[0, 1:]), mx.array(5), 0.0).tokens.tolist()
    assert (out / "README.md").read_text() == "# card\n"


def test_resume_continues_from_checkpoint(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path, steps=10)
    tr.run()
    again = _trainer(target, sequences, tmp_path, steps=20)
    assert again.try_resume() and again.step == 10
    np.testing.assert_allclose(np.array(again.drafter.fc.weight), np.array(tr.drafter.fc.weight))
    again.run()
    assert again.step == 20


def test_feature_cache_roundtrip_resume_and_disk_full(target, tmp_path):
    adapter = TargetAdapter(target, (0, 2))
    seqs = [Sequence_(f"p{i}", 0.0, p + [7, 8, 9], len(p)) for i, p in enumerate(PROMPTS)]
    folder = tmp_path / "feats"
    build_feature_cache(adapter, seqs[:3], folder, batch=2, shard_rows=10, log=lambda s: None)
    build_feature_cache(adapter, seqs, folder, batch=2, shard_rows=10, log=lambda s: None)
    stored = {s.id: s for s in load_feature_cache(folder)}
    assert sorted(stored) == [f"p{i}" for i in range(len(PROMPTS))]
    one = stored["p1"]
    ref = adapter.forward(mx.array([seqs[1].tokens]), None).features[0]
    np.testing.assert_allclose(one.features.astype(np.float32), np.array(ref), rtol=2e-3, atol=2e-3)
    # A full disk: a clear error naming the folder, and what was cached is kept.
    full = tmp_path / "full"
    full.mkdir()
    os.symlink("/dev/full", full / "shard_00000.tmp.npy")
    with pytest.raises(FeatureCacheError, match="disk is full"):
        build_feature_cache(adapter, seqs, full, batch=2, shard_rows=1, log=lambda s: None)
