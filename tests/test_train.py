"""Drafter training: the batched training forward, the objective, checkpoints and features."""

import errno
import json
import os
import signal
import random
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import tiny

from dflash2_mlx import load_drafter
from dflash2_mlx.errors import DFlash2Error, ParameterError
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.train.features import (
    FeatureCacheError,
    Sequence_,
    StoredSequence,
    build_feature_cache,
    load_feature_cache,
)
from dflash2_mlx.train.objective import Blocks, block_hidden
from dflash2_mlx.train.trainer import (
    TrainConfig,
    Trainer,
    drafter_config_for,
    evaluate_proxy,
    init_drafter,
    make_blocks,
    sample_anchors,
)

TARGET_CFG = {
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "head_dim": 16,
}
PROMPTS = [
    [3, 14, 15, 9, 26],
    [5, 35, 8, 9, 7, 9],
    [2, 7, 1, 8, 2, 8],
    [60, 61, 62],
    [11, 12, 13],
    [40, 41],
]


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


@pytest.mark.parametrize(
    "version,kw",
    [
        (1, {}),
        (2, {}),
        (1, {"is_causal": True}),
        (2, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6}),
    ],
)
def test_training_forward_equals_inference_forward(target, version, kw):
    d = tiny.make_drafter(version, block_size=8, **kw)
    adapter = TargetAdapter(target, d.config.target_layer_ids)
    d.bind(adapter.binding())
    seq = list(range(3, 40))
    feats = adapter.forward(mx.array([seq]), None).features
    anchors = [5, 11, 20]
    ids = mx.array([[seq[a]] + [d.config.mask_token_id] * 7 for a in anchors])
    h = block_hidden(
        d, Blocks(feats, mx.array([anchors]), ids[None], mx.zeros((1, 3, 7), dtype=mx.int32))
    )
    for j, a in enumerate(anchors):
        ref = d.hidden(ids[j : j + 1], feats[:, :a], d.make_cache())[0]
        np.testing.assert_allclose(np.array(h[j]), np.array(ref), atol=1e-4)


def test_dropout_is_training_only_and_random(target):
    """drop > 0 perturbs the training forward (a different mask every call); drop = 0 is the
    inference forward (above), and evaluation never drops."""
    d = tiny.make_drafter(2, block_size=8)
    adapter = TargetAdapter(target, d.config.target_layer_ids)
    d.bind(adapter.binding())
    seq = list(range(3, 40))
    b = Blocks(
        adapter.forward(mx.array([seq]), None).features,
        mx.array([[5, 20]]),
        mx.array([[[seq[a]] + [95] * 7 for a in (5, 20)]]),
        mx.zeros((1, 2, 7), dtype=mx.int32),
    )
    plain = np.array(block_hidden(d, b))
    np.testing.assert_array_equal(np.array(block_hidden(d, b, 0.0)), plain)
    one, two = np.array(block_hidden(d, b, 0.3)), np.array(block_hidden(d, b, 0.3))
    assert np.abs(one - plain).max() > 1e-2 and np.abs(one - two).max() > 1e-2


def _trainer(
    target,
    sequences,
    out: Path,
    version=2,
    steps=40,
    block_size=8,
    layer_ids=(0, 2),
    layers=2,
    **kw,
):
    cfg = TrainConfig(
        version=version,
        layers=layers,
        block_size=block_size,
        target_layer_ids=layer_ids,
        mask_token_id=95,
        steps=steps,
        batch_seqs=3,
        anchors_per_seq=8,
        eval_every=steps,
        checkpoint_every=10,
        lr=3e-3,
        negatives=16,
        selector_rank=8,
        **kw,
    )
    adapter = TargetAdapter(target, layer_ids)
    d = init_drafter(drafter_config_for(adapter, TARGET_CFG, cfg), cfg)
    return Trainer(adapter, d, sequences, sequences, cfg, out, log=lambda s: None)


@pytest.mark.parametrize("version", [1, 2])
def test_tiny_training_run_lowers_the_loss(target, sequences, tmp_path, version):
    tr = _trainer(target, sequences, tmp_path, version)
    losses = []
    final = tr.run(on_step=lambda r: losses.append(r["loss"]))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
    assert final["proxy_tau"] > 1.5
    # the training-set τ is measured on training sequences, with the trained drafter
    assert tr.fit_probe and all(any(p is s for s in sequences) for p in tr.fit_probe)
    assert final["train_tau"] == pytest.approx(
        evaluate_proxy(tr.drafter, tr.fit_probe, tr.scale, len(tr.fit_probe))["proxy_tau"]
    )


def test_training_with_dropout_still_lowers_the_loss(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path, steps=30, dropout=0.1)
    losses = []
    tr.run(on_step=lambda r: losses.append(r["loss"]))
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses


def test_export_reloads_and_drafts_identically(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path / "run", steps=12)
    tr.run()
    out = tr.export(tmp_path / "drafter", dtype=mx.float32, extra_files=[("README.md", "# card\n")])
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
    assert (
        reloaded.select(hid, reloaded.logits(hid), mx.array(5), 0.0).tokens.tolist()
        == tr.drafter.select(
            trained[0, 1:], tr.drafter.logits(trained[0, 1:]), mx.array(5), 0.0
        ).tokens.tolist()
    )
    assert (out / "README.md").read_text() == "# card\n"


def test_resume_continues_from_checkpoint(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path, steps=10)
    tr.run()
    again = _trainer(target, sequences, tmp_path, steps=20)
    assert again.try_resume() and again.step == 10
    np.testing.assert_allclose(np.array(again.drafter.fc.weight), np.array(tr.drafter.fc.weight))
    again.run()
    assert again.step == 20


def test_a_damaged_checkpoint_is_named_with_what_to_do(target, sequences, tmp_path):
    """A checkpoint file cut short, edited or lost is one error naming it (and how to train
    afresh), not a JSONDecodeError, a TypeError or mlx's "[load_npz]" traceback."""
    import shutil

    from dflash2_mlx.errors import CheckpointError

    _trainer(target, sequences, tmp_path / "run", steps=10).run()
    damages = {
        "state.json": lambda p: p.write_text("{garbage"),
        "state.json ": lambda p: p.write_text(
            json.dumps({**json.loads(p.read_text()), "step": "x"})
        ),
        "optimizer.npz": lambda p: p.unlink(),
        "optimizer.npz ": lambda p: p.write_bytes(p.read_bytes()[:500]),
        "feature_scale.npy": lambda p: p.write_bytes(b""),
        "feature_scale.npy ": lambda p: np.save(p, np.ones(7, np.float32)),  # another width
    }
    for i, (name, damage) in enumerate(damages.items()):
        out = tmp_path / f"case{i}"
        shutil.copytree(tmp_path / "run", out)
        damage(out / "checkpoint" / name.strip())
        with pytest.raises(CheckpointError) as refused:
            _trainer(target, sequences, out, steps=20).try_resume()
        message = str(refused.value)
        assert message.startswith(f"{out / 'checkpoint' / name.strip()}: cannot resume"), message
        assert f"delete {out} to train afresh" in message


def test_a_damaged_feature_cache_or_work_record_is_named(target, tmp_path):
    from dflash2_mlx.train.preflight import check_work_identity

    adapter = TargetAdapter(target, (0, 2))
    seqs = [Sequence_(f"p{i}", 0.0, p + [7, 8, 9], len(p)) for i, p in enumerate(PROMPTS)]
    folder = tmp_path / "feats"
    build_feature_cache(adapter, seqs, folder, batch=2, shard_rows=10, log=lambda s: None)
    shard = folder / "shard_00000.npy"
    shard.write_bytes(shard.read_bytes()[:300])
    with pytest.raises(FeatureCacheError, match="the feature cache is damaged .*delete the folder"):
        load_feature_cache(folder)
    (folder / "meta.json").write_text("{bad")
    with pytest.raises(FeatureCacheError, match="the feature cache is damaged"):
        build_feature_cache(adapter, seqs, folder, batch=2, shard_rows=10, log=lambda s: None)
    (folder / "meta.json").unlink()
    index = folder / "index.jsonl"  # a kill during an append: the last line cut
    index.write_text(index.read_text()[:-20])
    with pytest.raises(FeatureCacheError, match="the feature cache is damaged"):
        build_feature_cache(adapter, seqs, folder, batch=2, shard_rows=10, log=lambda s: None)
    work = tmp_path / "work"
    work.mkdir()
    (work / "work.json").write_text("{bad")
    (tmp_path / "config.json").write_text("{}")  # the target folder's, which it fingerprints
    with pytest.raises(ParameterError, match=r"work\.json: damaged .*use a new --work folder"):
        check_work_identity(work, tmp_path, 32, 64)


def test_init_from_takes_its_start_shapes_and_refuses_another_targets(target, tmp_path):
    """--init-from a drafter of another target is refused by what differs (it blamed the
    --layer-ids the user never gave); a start's selector rank and conv shapes, which no flag
    sets, are the run's (they failed on a tensor's shape)."""
    from dflash2_mlx import save_drafter
    from dflash2_mlx.train.drafter_init import adopt_start, check_start_fits

    probe = TargetAdapter(target, ())
    ours, wide = tmp_path / "ours", tmp_path / "wide"
    save_drafter(tiny.make_drafter(2, layer_ids=(0, 2)), ours)
    check_start_fits(ours, probe)
    cfg = TrainConfig(version=2, selector_rank=64, conv_group_size=4)
    adopt_start(cfg, ours)
    start = load_drafter(ours).config
    assert (cfg.selector_rank, cfg.conv_group_size) == (start.selector_rank, start.conv_group_size)
    assert cfg.target_layer_ids == (0, 2)
    save_drafter(tiny.make_drafter(2, hidden=128, layer_ids=(0, 9)), wide)
    with pytest.raises(DFlash2Error, match=r"--init-from .*wide: was trained for another target"):
        check_start_fits(wide, probe)


def test_an_interrupted_run_resumed_ends_as_the_uninterrupted_one(target, sequences, tmp_path):
    """The checkpoint keeps the batch sampler's whole state and MLX's (dropout), so the same
    command and seed give the same drafter whether or not it was stopped midway (a resume
    used to reseed the sampler)."""

    def stop_at_7(rec):
        if rec["step"] == 7:
            raise KeyboardInterrupt

    whole = _trainer(target, sequences, tmp_path / "whole", steps=16, dropout=0.1)
    whole.run()
    cut = _trainer(target, sequences, tmp_path / "cut", steps=16, dropout=0.1)
    with pytest.raises(KeyboardInterrupt):
        cut.run(on_step=stop_at_7)
    again = _trainer(target, sequences, tmp_path / "cut", steps=16, dropout=0.1)
    assert again.try_resume() and again.step == 7
    again.run()
    for name in ("fc", "hidden_norm"):
        np.testing.assert_array_equal(
            np.array(getattr(again.drafter, name).weight),
            np.array(getattr(whole.drafter, name).weight),
        )


def test_a_ctrl_c_mid_step_waits_for_the_step_and_resumes_alike(target, sequences, tmp_path):
    """A real SIGINT (or SIGTERM) lands inside a step, after the batch sampler drew: the step
    finishes before the interrupt is raised, so the checkpoint holds a whole step and the
    resumed run ends as the uninterrupted one (it saved the sampler past the cut step)."""
    whole = _trainer(target, sequences, tmp_path / "whole", steps=12)
    whole.run()
    for signum in (signal.SIGINT, signal.SIGTERM):
        folder = tmp_path / f"cut-{signum}"
        cut = _trainer(target, sequences, folder, steps=12)
        draw = cut.next_batch

        def signalled(draw=draw, cut=cut, signum=signum):
            batch = draw()
            if cut.step == 5:
                os.kill(os.getpid(), signum)  # mid-step: the sampler has drawn
            return batch

        cut.next_batch = signalled
        before = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
        # Python's own SIGINT handler, whatever this process inherited (a `&` job ignores it)
        before_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt):
                cut.run()
        finally:
            signal.signal(signal.SIGTERM, before)
            signal.signal(signal.SIGINT, before_int)
        again = _trainer(target, sequences, folder, steps=12)
        assert again.try_resume() and again.step == 6  # the cut step whole
        again.run()
        np.testing.assert_array_equal(
            np.array(again.drafter.fc.weight), np.array(whole.drafter.fc.weight)
        )


def test_a_step_leaves_an_ignored_interrupt_ignored():
    """A training run started in the background of a script ignores SIGINT: a step must not
    turn it into a KeyboardInterrupt; an interrupt that is not ignored raises at the step's
    end, through its own handler."""
    from dflash2_mlx.train.interrupts import whole_step

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with whole_step():
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    finished = []
    # Python's own handler, whatever this process inherited (a `&` job starts ignoring SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with whole_step():
                os.kill(os.getpid(), signal.SIGINT)
                finished.append(True)  # the step goes on to its end
    finally:
        signal.signal(signal.SIGINT, before)
    assert finished == [True]


def test_feature_cache_roundtrip_resume_and_disk_full(target, tmp_path, monkeypatch):
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
    if os.path.exists("/dev/full"):  # Linux: a device whose every write fails with ENOSPC
        os.symlink("/dev/full", full / "shard_00000.tmp.npy")
    else:  # macOS has none: the save itself fails as a full disk's would

        def no_space(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(np, "save", no_space)
    with pytest.raises(FeatureCacheError, match="disk is full"):
        build_feature_cache(adapter, seqs, full, batch=2, shard_rows=1, log=lambda s: None)


@pytest.mark.parametrize(
    "error, said",
    [  # numpy's own short write on a full disk carries no errno
        (OSError("3376896 requested and 974784 written"), "the disk is full. Free space"),
        (OSError(errno.EROFS, os.strerror(errno.EROFS)), "Read-only file system. Fix that"),
    ],
)
def test_a_shard_that_cannot_be_written_is_named_with_why(
    target, tmp_path, monkeypatch, error, said
):
    """The shard's name and why, and what is kept: no traceback of a second error from the
    cleanup (a read-only folder refuses the temporary file's removal too)."""
    d = tiny.make_drafter(2, block_size=4)
    adapter = TargetAdapter(target, d.config.target_layer_ids)
    seqs = [Sequence_("a", 0.0, [1, 2, 3, 4, 5, 6], 2)]

    def fails(*args, **kwargs):
        raise error

    monkeypatch.setattr(np, "save", fails)
    monkeypatch.setattr(Path, "unlink", fails)
    with pytest.raises(FeatureCacheError, match=f"shard_00000.npy: {said}") as e:
        build_feature_cache(adapter, seqs, tmp_path / "f", batch=2, shard_rows=1, log=print)
    assert "0 sequences are cached and will be kept" in str(e.value)


def test_batched_blocks_of_unequal_sequences_match_inference(target):
    """Two sequences right-padded into one batch: every block equals the cached inference forward."""
    d = tiny.make_drafter(2, block_size=8)
    adapter = TargetAdapter(target, d.config.target_layer_ids)
    d.bind(adapter.binding())
    seqs = [list(range(3, 40)), list(range(50, 70))]
    stored = [
        StoredSequence(
            f"u{i}",
            0.0,
            np.array(s, dtype=np.int32),
            2,
            np.array(adapter.forward(mx.array([s]), None).features[0]),
        )
        for i, s in enumerate(seqs)
    ]
    anchors = [[5, 20, 29], [3, 9, 12]]
    b = make_blocks(
        stored, anchors, 8, d.config.mask_token_id, mx.ones(stored[0].features.shape[1])
    )
    assert b.features.shape[1] == 64  # padded to a multiple of 64 rows
    h = block_hidden(d, b)
    for i, s in enumerate(seqs):
        for j, a in enumerate(anchors[i]):
            ids = mx.array([[s[a]] + [d.config.mask_token_id] * 7])
            ref = d.hidden(ids, b.features[i : i + 1, :a], d.make_cache())[0]
            np.testing.assert_allclose(np.array(h[i * 3 + j]), np.array(ref), atol=1e-4)
            assert b.labels[i, j].tolist() == s[a + 1 : a + 8]


def test_anchors_sampled_with_replacement_when_the_response_is_short():
    import random

    seq = StoredSequence("s", 0.0, np.arange(14, dtype=np.int32), 4, np.zeros((14, 2), np.float16))
    got = sample_anchors(seq, 10, 8, random.Random(0))
    assert len(got) == 10 and set(got) <= set(range(3, 7))
    assert sample_anchors(seq, 0, 8, random.Random(0), every=2) == [3, 5]
    assert (
        sample_anchors(
            StoredSequence("t", 0.0, np.arange(9, dtype=np.int32), 6, np.zeros((9, 2), np.float16)),
            4,
            8,
            random.Random(0),
        )
        is None
    )


def test_ablation_switches_keep_their_part_neutral(target, sequences, tmp_path):
    """--no-selector: the selector never trains, so its walk is the per-position argmax;
    --no-conv: the convs stay the identity."""
    no_sel = _trainer(target, sequences, tmp_path / "a", steps=6, selector_weight=0.0)
    no_sel.run()
    d = no_sel.drafter
    assert not np.any(np.array(d.candidate_selector.successor_codebook))
    h = mx.random.normal((7, d.config.hidden_size))
    logits = d.logits(d.norm(h))
    assert (
        d.select(d.norm(h), logits, mx.array(3), 0.0).tokens.tolist()
        == mx.argmax(logits, axis=-1).tolist()
    )
    no_conv = _trainer(target, sequences, tmp_path / "b", steps=6, train_conv=False)
    before = [np.array(layer.mlp_conv.base_kernel) for layer in no_conv.drafter.layers]
    no_conv.run()
    for layer, b0 in zip(no_conv.drafter.layers, before):
        for conv in (layer.attention_conv, layer.mlp_conv):
            np.testing.assert_array_equal(np.array(conv.base_kernel), b0)
            assert not np.any(np.array(conv.kernel_projection.weight))
    assert no_conv.drafter.fc.weight.abs().sum().item() > 0


@pytest.fixture(scope="module")
def sequences_with_last_layer(target, sequences):
    """The same sequences with features of layers (0, 3): 3 is the tiny target's last layer."""
    adapter = TargetAdapter(target, (0, 3))
    return [
        StoredSequence(
            s.id,
            0.0,
            s.tokens,
            s.response_start,
            np.array(
                adapter.forward(mx.array([s.tokens.tolist()]), None).features[0].astype(mx.float16)
            ),
        )
        for s in sequences
    ]


def test_distillation_teacher_is_the_targets_own_next_token_logits(
    target, sequences_with_last_layer, tmp_path
):
    seqs = sequences_with_last_layer
    tr = _trainer(target, seqs, tmp_path, steps=1, layer_ids=(0, 3), distill_weight=1.0)
    s, anchors = seqs[1], [6, 13, 30]
    b = make_blocks([s], [anchors], 8, 95, tr.scale)
    got = np.array(tr.teacher().logits(b))  # [3, 7, len(subset)]
    full = np.array(target(mx.array([s.tokens.tolist()]))[0])  # [S, V]
    cols = np.array(tr.subset.ids)
    for j, a in enumerate(anchors):
        want = full[a : a + 7][:, cols]  # the logits that predict x_{a+1} .. x_{a+7}
        np.testing.assert_allclose(got[j], want, atol=2e-2 * np.abs(want).max())
        assert (cols[got[j].argmax(-1)] == s.tokens[a + 1 : a + 8]).all()  # greedy data


def test_distillation_run_lowers_the_kl_and_needs_the_last_layer(
    target, sequences, sequences_with_last_layer, tmp_path
):
    tr = _trainer(
        target, sequences_with_last_layer, tmp_path, steps=30, layer_ids=(0, 3), distill_weight=1.0
    )
    recs = []
    tr.run(on_step=recs.append)
    kl = [r["distill"] for r in recs]
    assert np.mean(kl[-5:]) < 0.5 * np.mean(kl[:5]), kl
    assert recs[-1]["loss"] > recs[-1]["base"]  # the KL is part of the loss
    with pytest.raises(DFlash2Error, match=r"last layer \(3\)"):
        _trainer(target, sequences, tmp_path / "b", layer_ids=(0, 2), distill_weight=1.0)


def test_init_from_target_copies_the_top_layers(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path, steps=1, init_from_target=True)
    d, n = tr.drafter, len(tr.adapter.layers)
    for j, layer in enumerate(d.layers):
        src = tr.adapter.layers[n - len(d.layers) + j]
        np.testing.assert_array_equal(
            np.array(layer.mlp.down_proj.weight), np.array(src.mlp.down_proj.weight)
        )
        np.testing.assert_array_equal(
            np.array(layer.self_attn.q_proj.weight), np.array(src.self_attn.q_proj.weight)
        )
    # The context rows start as the (normed) last captured feature, whatever the scaling.
    s = sequences[0]
    feats = mx.array(s.features.astype(np.float32))[None]
    h = d.config.hidden_size
    want = d.hidden_norm(feats[..., -h:])
    np.testing.assert_allclose(np.array(d.context(feats * tr.scale)), np.array(want), atol=1e-3)
    more = n + 1  # more layers than the target has: refused, not copied round from layer 0
    with pytest.raises(DFlash2Error, match=f"--layers {more} is more than the target's {n}"):
        _trainer(target, sequences, tmp_path / "deep", steps=1, init_from_target=True, layers=more)


def test_prompt_parts_name_their_own_temperatures():
    from dflash2_mlx.train.pipeline import prompt_parts

    assert prompt_parts("train@0,0.7+train-extra", (0.0,)) == [
        ("train", (0.0, 0.7)),
        ("train-extra", (0.0,)),
    ]
    # A suffix that is not numbers belongs to a file name.
    assert prompt_parts("my@work/p.jsonl+train", (0.5,)) == [
        ("my@work/p.jsonl", (0.5,)),
        ("train", (0.5,)),
    ]
    # ... unless the name before the '@' is a prompt file and the whole is none: a typo
    with pytest.raises(ParameterError, match=r"after '@' must be numbers .*got '0,abc'"):
        prompt_parts("train@0,abc", (0.5,))


def _prompt_file(path: Path, n: int, stem: str) -> Path:
    words = ["the", "sea", "is", "blue", "and", "wide", "cats", "sleep", "all", "day"]
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"{stem}{i}",
                    "category": "chat",
                    "messages": [
                        {
                            "role": "user",
                            "content": " ".join(
                                [stem] + [words[(i + k) % len(words)] for k in range(4)]
                            ),
                        }
                    ],
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return path


def test_train_command_end_to_end_then_ablation(tmp_path, capsys, monkeypatch):
    """`dflash2 train` on a tiny real target folder: regenerate, cache features, train, export an
    official-format folder with its card; `--ablation` trains the four variants side by side."""
    import json

    from dflash2_cli.app import run
    from tiny_pair import save_target

    target_dir = save_target(tmp_path / "target")
    prompts = str(_prompt_file(tmp_path / "p.jsonl", 6, "p"))
    common = [
        "--work",
        str(tmp_path / "work"),
        "--prompts",
        prompts,
        "--heldout",
        str(_prompt_file(tmp_path / "h.jsonl", 2, "h")),
        "--batch",
        "2",
        "--anchors",
        "4",
        "--max-new-tokens",
        "16",
        "--layers",
        "1",
        "--temperatures",
        "0",
        "--layer-ids",
        "0,2",
        "--block-size",
        "4",
        "--regen-batch",
        "3",
    ]
    out = tmp_path / "drafter"
    # This set of prompts is also regenerated at T=0.7 (PATH@temperatures overrides --temperatures).
    assert (
        run(
            [
                "train",
                str(target_dir),
                "--out",
                str(out),
                "--steps",
                "4",
                *[a for a in common if a not in ("--temperatures", "0")],  # the prompts' own
                "--prompts",
                prompts + "@0,0.7",
            ]
        )
        == 0
    )
    d = load_drafter(out)
    assert (
        d.config.version == 2 and d.config.block_size == 4 and d.config.target_layer_ids == (0, 2)
    )
    card = (out / "README.md").read_text()
    assert "--steps 4" in card
    assert f"({prompts} at T = 0, 0.7)" in card  # the temperatures each set was regenerated at
    log = json.loads((out / "training.json").read_text())
    assert log["stages"]["train"]["steps"] == 4
    pipeline = log["pipeline"]  # JSON's own types, paths as strings
    assert pipeline["temperatures"] == [0.0, 0.7] and pipeline["corpus"] is None
    assert pipeline["skip_bad_lines"] is False and pipeline["out"] == str(out)
    assert f"at most): {log['final']['train_tau']:.3f}" in card
    # The draft vocabulary: every token of the training responses, loaded with the drafter.
    regen = [json.loads(line) for line in (tmp_path / "work" / "regen_train.jsonl").open()]
    emitted = {t for r in regen for t in r["response_ids"]}
    assert set(d.draft_vocab.tolist()) == emitted
    assert sorted((r["id"], r["temperature"]) for r in regen) == sorted(
        (f"p{i}", t) for i in range(6) for t in (0.0, 0.7)
    )
    assert "of the 12 training regenerations" in (out / "draft_vocab.json").read_text()
    # The response datastore: those responses end to end (never the held-out ones), which a
    # pair loaded from the folder drafts from
    from dflash2_mlx.engine.datastore import find_datastore

    store = np.load(find_datastore(out))
    separator = int(store["separator"])
    answers = [r["response_ids"] for r in regen]
    assert store["tokens"].tolist() == [t for ids in answers for t in (*ids, separator)]
    tokens = sum(map(len, answers))  # the card says how much it trained on, and the store
    assert f"; 12 answers, {tokens:,} answer tokens" in card
    assert "Response datastore: `datastore.npz` holds those answers" in card
    # Rerunning the finished command changes nothing: the record of the run stays as it was.
    record = (out / "training.json").read_text()
    capsys.readouterr()
    own_temps = [a for a in common if a not in ("--temperatures", "0")]  # the prompts' own
    again = ["train", str(target_dir), "--out", str(out), "--steps", "4", *own_temps]
    assert run([*again, "--prompts", prompts + "@0,0.7"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "already trained to step 4: nothing to do" in said and "written" not in said
    assert (out / "training.json").read_text() == record
    # The same data and work folder spelled otherwise: still nothing to do
    monkeypatch.chdir(tmp_path)
    spelled = [{str(tmp_path / "work"): "work"}.get(a, a) for a in again]
    assert run([*spelled, "--prompts", "p.jsonl@0.7,0"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "already trained to step 4: nothing to do" in said, said
    # Other data at the same --steps: nothing left to train on it, said (not "nothing to do")
    assert run([*again, "--prompts", prompts + "@0"]) != 0
    said = " ".join(capsys.readouterr().err.split())
    assert "already trained to step 4 (the --steps asked) on other data" in said, said
    assert "raise --steps to train on it" in said and (out / "training.json").read_text() == record
    # OUT holding an earlier drafter than the checkpoint (interrupted after the last step's
    # checkpoint, before its export): the rerun exports the checkpoint
    earlier = json.loads(record)
    earlier["stages"]["train"]["steps"] = 2
    (out / "training.json").write_text(json.dumps(earlier))
    assert run([*again, "--prompts", prompts + "@0"]) != 0  # not exported as other data's
    assert "on other data" in capsys.readouterr().err
    assert (out / "training.json").read_text() == json.dumps(earlier)
    assert run([*again, "--prompts", prompts + "@0,0.7"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "nothing to do" not in said, said
    assert json.loads((out / "training.json").read_text())["stages"]["train"]["steps"] == 4
    # another work folder (so other settings may apply) replaces it, and says so first
    other = [tmp_path / "work2" if a == str(tmp_path / "work") else a for a in again]
    assert run([*map(str, other), "--prompts", prompts + "@0,0.7"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"{out} holds a drafter trained before: this run replaces it when it ends" in said

    abl = tmp_path / "ablation"
    assert (
        run(["train", str(target_dir), "--out", str(abl), "--steps", "3", "--ablation", *common])
        == 0
    )
    summary = json.loads((abl / "ablation.json").read_text())
    assert list(summary["variants"]) == [
        "dflash",
        "dflash2-conv-only",
        "dflash2-selector-only",
        "dflash2",
    ]
    assert all(v["proxy_tau"] >= 1.0 for v in summary["variants"].values())
    assert load_drafter(abl / "dflash").config.version == 1
    assert "DFlash vs" not in capsys.readouterr().err

    assert (
        run(["train", str(target_dir), "--out", str(out), "--version", "1", "--no-conv", *common])
        == 2
    )
    assert "--version 1 has neither" in capsys.readouterr().err
    # Distillation reads the target's last layer: refused up front when it is not captured.
    assert (
        run(["train", str(target_dir), "--out", str(tmp_path / "kd"), "--distill", "1", *common])
        == 2
    )
    err = capsys.readouterr().err
    assert "distillation needs the target's last layer" in err and "--distill 0" in err
    assert not (tmp_path / "work" / "run-kd").exists()
    # A refused run writes nothing: its corrected rerun is not refused by what it left.
    fresh = [a if a != str(tmp_path / "work") else str(tmp_path / "w2") for a in common]
    for bad in (["--distill", "1"], ["--mask-token-id", "99999"]):
        assert run(["train", str(target_dir), "--out", str(tmp_path / "o2"), *fresh, *bad]) == 2
        assert not (tmp_path / "o2").exists() and not (tmp_path / "w2").exists(), bad
    assert "mask token id 99999 (--mask-token-id) is outside" in capsys.readouterr().err


def _refused(args: list[str], capsys) -> str:
    """`dflash2 train ARGS` exits 2 with one error line on stderr; returns it."""
    from dflash2_cli.app import run

    assert run(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err, err
    return err


def test_train_refuses_up_front_what_would_fail_later(tmp_path, capsys):
    """Mistakes that used to cost a whole run (or hang, or overwrite a user's files) are one
    line before any regeneration: --out a file or a folder of other files, answers too short
    for a block, negative temperatures, held-out prompts that are training prompts."""
    from tiny_pair import save_target

    target = str(save_target(tmp_path / "target"))
    prompts = str(_prompt_file(tmp_path / "p.jsonl", 3, "p"))
    base = [
        target,
        "--prompts",
        prompts,
        "--heldout",
        str(_prompt_file(tmp_path / "h.jsonl", 2, "h")),
    ]
    (tmp_path / "afile").write_text("x")
    assert "is a file" in _refused([*base, "--out", str(tmp_path / "afile")], capsys)
    mine = tmp_path / "mydocs"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    assert "notes.md" in _refused([*base, "--out", str(mine)], capsys)
    assert (mine / "notes.md").read_text() == "mine"
    finder = tmp_path / "finder"  # dotfiles (a Mac's .DS_Store) do not count
    finder.mkdir()
    (finder / ".DS_Store").write_text("x")
    err = _refused([*base, "--out", str(finder), "--temperatures", "-1"], capsys)
    assert "--temperatures" in err and "--out" not in err  # finder passed, nothing written
    assert not (finder / ".dflash2-train").exists() and not (tmp_path / "finder.work").exists()
    out = str(tmp_path / "d")
    err = _refused([*base, "--out", out, "--max-new-tokens", "8", "--block-size", "16"], capsys)
    assert "--max-new-tokens 8 must be at least --block-size - 1 (15)" in err
    for flag in (
        ["--temperatures", "0,-1"],
        ["--temperatures", "nan"],
        ["--prompts", f"{prompts}@inf"],
    ):
        err = _refused([*base, "--out", out, *flag], capsys)  # the last --prompts wins
        assert "(--temperatures, or NAME@T in --prompts) must be finite and >= 0" in err
    err = _refused([target, "--prompts", prompts, "--heldout", prompts, "--out", out], capsys)
    assert "'p0' is also training prompt 'p0'" in err
    assert not (tmp_path / "d.work" / "regen_train.jsonl").exists()  # nothing ran


def test_train_refuses_what_it_reads_before_writing_anything(tmp_path, capsys, monkeypatch):
    """A target, --init-from or --corpus that cannot be read is one line naming it, before
    the target loads and before --out or its work folder exist."""
    from tiny_pair import save_target

    target = str(save_target(tmp_path / "target"))
    prompts = str(_prompt_file(tmp_path / "p.jsonl", 3, "p"))
    base = ["--prompts", prompts, "--heldout", str(_prompt_file(tmp_path / "h.jsonl", 2, "h"))]
    out = tmp_path / "d"
    (tmp_path / "plain").mkdir()
    chat = b'[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]'
    (tmp_path / "junk.jsonl").write_bytes(b'{"id": "a", "messages": ' + chat + b"}\n\xff\xfe\n")
    (tmp_path / "asks.jsonl").write_text(
        '{"id": "a", "messages": [{"role": "user", "content": "q"}]}'
    )
    for args, says in (
        ([str(tmp_path / "nowhere"), *base], "target"),
        ([str(tmp_path / "plain"), *base], "no config.json"),
        ([target, *base, "--init-from", str(tmp_path / "nowhere")], "drafter"),
        ([target, *base, "--init-from", prompts], "expected a model folder, found a file"),
        ([target, *base, "--init-from", str(tmp_path / "plain")], "--init-from"),
        ([target, *base, "--corpus", str(tmp_path / "plain"), "--corpus-distill", "0"], "*.jsonl"),
        (
            [target, *base, "--corpus", str(tmp_path / "junk.jsonl"), "--corpus-distill", "0"],
            "UTF-8",
        ),
        (
            [target, *base, "--corpus", str(tmp_path / "asks.jsonl"), "--corpus-distill", "0"],
            "asks.jsonl:1: messages hold no assistant turn",
        ),
    ):
        err = _refused([*args, "--out", str(out)], capsys)
        assert says in err, (args, err)
        assert not out.exists() and not (tmp_path / "d.work").exists(), args
    # read by the chat template once the target loads, still before any regeneration
    strict = str(
        save_target(
            tmp_path / "strict",
            chat_template="{% for m in messages %}{% if m['role'] == 'tool' %}"
            "{{ raise_exception('no tool turns here') }}{% endif %}{{ m['content'] }} "
            "{% endfor %}",
        )
    )
    tool = [{"role": "user", "content": "q"}, {"role": "tool", "content": "t"}]
    tool += [{"role": "assistant", "content": "a b c d e f"}]
    (tmp_path / "tools.jsonl").write_text(json.dumps({"id": "t1", "messages": tool}) + "\n")
    first = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"}]
    (tmp_path / "first.jsonl").write_text(json.dumps({"id": "f1", "messages": first}) + "\n")
    for args, says in (
        ([strict, "--corpus", str(tmp_path / "tools.jsonl")], "record 't1': the chat template: no"),
        ([target, "--corpus", str(tmp_path / "first.jsonl")], "first.jsonl:1: messages begin with"),
    ):
        err = _refused([*args, *base, "--corpus-distill", "0", "--out", str(out)], capsys)
        assert says in err, (args, err)
        assert not out.exists() and not (tmp_path / "d.work").exists(), args
    monkeypatch.chdir(tmp_path)  # --out . is the folder it names (here one with files)
    assert str(tmp_path) in _refused([target, *base, "--out", "."], capsys)


def test_a_checkpoint_resumes_only_for_its_own_out_and_settings(target, sequences, tmp_path):
    """A run's checkpoint is resumed by the same --out under the same settings (steps and
    the data mix may change); another folder of the same name, or other settings, are refused
    before any step instead of silently continuing someone else's training."""
    from dflash2_mlx.errors import DFlash2Error
    from dflash2_mlx.train.preflight import check_earlier_run, check_out, check_resumable, claim_run

    run = tmp_path / "work" / "run-d"
    claim_run(run, tmp_path / "d")
    claim_run(run, tmp_path / "d")  # the same --out: fine
    with pytest.raises(DFlash2Error, match="holds the training of --out"):
        claim_run(run, tmp_path / "other" / "d")
    tr = _trainer(target, sequences, tmp_path, steps=4)
    tr.run()
    state = json.loads((tr.ckpt / "state.json").read_text())
    check_resumable(state, replace(tr.cfg, steps=8, fixed_ratio=0.0), tr.ckpt)
    with pytest.raises(DFlash2Error, match="seed 0 there, 5 now"):
        check_resumable(state, replace(tr.cfg, seed=5), tr.ckpt)
    with pytest.raises(DFlash2Error, match="past --steps 2"):
        check_resumable(state, replace(tr.cfg, steps=2), tr.ckpt)
    edited = {**state, "config": {**state["config"], "block_size": str(tr.cfg.block_size)}}
    shown = f"block_size '{tr.cfg.block_size}' there, {tr.cfg.block_size} now"  # not "8 ... 8"
    with pytest.raises(DFlash2Error, match=shown):
        check_resumable(edited, tr.cfg, tr.ckpt)
    # Refused before the data stage too (the run folder's checkpoint is read up front).
    with pytest.raises(DFlash2Error, match="seed 0 there, 5 now"):
        check_earlier_run(tr.out, tmp_path / "d", replace(tr.cfg, seed=5))
    # An --out this run started (its marker), e.g. an ablation cut after its first variant.
    abl = tmp_path / "abl"
    check_out(abl, tmp_path / "abl.work")
    (abl / "dflash").mkdir()
    check_out(abl, tmp_path / "abl.work")
    with pytest.raises(DFlash2Error, match="block_size"):
        _trainer(
            target, sequences, tmp_path, steps=8, block_size=tr.cfg.block_size // 2
        ).try_resume()


def test_init_from_an_exported_drafter_even_at_another_block_size(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path / "a", steps=8)
    tr.run()
    exported = tr.export(tmp_path / "drafter", dtype=mx.float32)
    again = _trainer(
        target, sequences, tmp_path / "b", steps=1, block_size=16, init_from=str(exported)
    )
    assert again.drafter.config.block_size == 16
    s = sequences[1]
    feats = mx.array(s.features.astype(np.float32))[None, :12] * tr.scale
    block = mx.array([[int(s.tokens[12])] + [95] * 7])
    np.testing.assert_allclose(
        np.array(again.drafter.hidden(block, feats, again.drafter.make_cache())),
        np.array(tr.drafter.hidden(block, feats, tr.drafter.make_cache())),
        atol=1e-4,
    )
    from_ckpt = _trainer(target, sequences, tmp_path / "e", steps=1, init_from=str(tr.ckpt))
    np.testing.assert_allclose(
        np.array(from_ckpt.drafter.fc.weight * from_ckpt.scale),
        np.array(tr.drafter.fc.weight * tr.scale),
        rtol=1e-5,
        atol=1e-6,
    )
    v1 = _trainer(target, sequences, tmp_path / "c", version=1, steps=1).export(tmp_path / "v1")
    with pytest.raises(DFlash2Error, match="is a DFlash drafter; --version 2 trains a DFlash2"):
        _trainer(target, sequences, tmp_path / "d", steps=1, init_from=str(v1))
    with pytest.raises(DFlash2Error, match="is a DFlash2 drafter; --version 1 trains a DFlash "):
        _trainer(target, sequences, tmp_path / "f", steps=1, version=1, init_from=str(exported))


def test_init_from_a_smaller_drafter_grows_it_by_identity_layers(target, sequences, tmp_path):
    tr = _trainer(target, sequences, tmp_path / "a", steps=8)
    tr.run()
    exported = tr.export(tmp_path / "drafter", dtype=mx.float32)
    grown = _trainer(target, sequences, tmp_path / "b", steps=1, layers=3, init_from=str(exported))
    new = grown.drafter.layers[2]
    assert not np.any(np.array(new.self_attn.o_proj.weight))
    assert not np.any(np.array(new.mlp.down_proj.weight))
    np.testing.assert_array_equal(  # the rest of the new layer is the source's last layer
        np.array(new.self_attn.q_proj.weight),
        np.array(tr.drafter.layers[1].self_attn.q_proj.weight),
    )
    s = sequences[1]
    feats = mx.array(s.features.astype(np.float32))[None, :12] * tr.scale
    block = mx.array([[int(s.tokens[12])] + [95] * 7])
    np.testing.assert_allclose(  # the grown drafter starts as the source's function
        np.array(grown.drafter.hidden(block, feats, grown.drafter.make_cache())),
        np.array(tr.drafter.hidden(block, feats, tr.drafter.make_cache())),
        atol=1e-4,
    )
    grown.run()  # and trains: the new layer's writers move off zero
    assert np.any(np.array(grown.drafter.layers[2].mlp.down_proj.weight))
    big = grown.export(tmp_path / "big", dtype=mx.float32)
    with pytest.raises(DFlash2Error, match="has 3 layers, more than this drafter's 2"):
        _trainer(target, sequences, tmp_path / "c", steps=1, init_from=str(big))


@pytest.mark.parametrize("layers", [2, 3])
def test_init_from_keeps_the_start_drafters_own_geometry_and_attention(
    target, sequences, tmp_path, layers
):
    """A start whose heads, sliding windows, RoPE and norms differ from the target's (as
    official drafters' do): the run keeps them, so it starts as that drafter's function
    (they were taken from the target's config, another model; other heads were refused on a
    tensor's shape), a grown layer with its last layer's type."""
    import json

    from dflash2_mlx import save_drafter
    from dflash2_mlx.drafter.model import Drafter
    from dflash2_mlx.checkpoint import read_config
    from dflash2_mlx.train.drafter_init import adopt_start, start_tensors

    folder = tmp_path / "start"
    save_drafter(tiny.make_drafter(2, layer_ids=(0, 2)), folder)
    raw = json.loads((folder / "config.json").read_text())
    heads = raw["num_attention_heads"] * 2
    raw.update(
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        intermediate_size=raw["intermediate_size"] + 32,
        layer_types=["full_attention", "sliding_attention"],
        sliding_window=4,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    raw.pop("is_causal", None)  # sliding layers are then causal, the others not
    raw.pop("rope_theta", None)
    (folder / "config.json").write_text(json.dumps(raw))
    for f in folder.glob("*.safetensors"):
        f.unlink()
    start = Drafter(read_config(folder))
    mx.eval(start.parameters())
    save_drafter(start, folder)
    cfg = TrainConfig(version=2, layers=layers, mask_token_id=95, init_from=str(folder))
    adopt_start(cfg, folder)
    adapter = TargetAdapter(target, (0, 2))
    dcfg = drafter_config_for(adapter, TARGET_CFG, cfg)
    s_cfg = start.config
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "head_dim"):
        assert getattr(dcfg, field) == getattr(s_cfg, field), field
    assert (dcfg.rope_theta, dcfg.rms_norm_eps, dcfg.sliding_window) == (1e6, 1e-5, 4)
    assert dcfg.layer_types == ("full_attention", "sliding_attention", "sliding_attention")[:layers]
    grown = Drafter(dcfg)
    grown.load_weights(list(start_tensors(grown, folder).items()))
    for d in (start, grown):
        d.bind(adapter.binding())
    feats = mx.random.normal((1, 12, start.fc.weight.shape[1]))
    block = mx.array([[3] + [95] * 7])
    np.testing.assert_allclose(
        np.array(grown.hidden(block, feats, grown.make_cache())),
        np.array(start.hidden(block, feats, start.make_cache())),
        atol=1e-4,
    )


def test_train_progress_shows_loss_speed_and_eta_on_a_terminal():
    import io

    from dflash2_cli.train_progress import training_progress
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    progress, on_step = training_progress(console, steps=20)
    with progress:
        for step in range(1, 21):
            rec = {"step": step, "loss": 5.0 - step / 10, "lr": 1e-3, "tok_s": 1234.0}
            if step == 20:
                rec.update(proxy_tau=1.75, train_tau=2.5)
            on_step(rec)
    import re

    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "20/20" in out and "loss 3.000" in out and "1234 tok/s" in out
    assert "0:00:00" in out  # the ETA column
    assert "τ(held-out) 1.750  τ(train) 2.500" in out
    # A log (not a terminal) gets plain lines every 10 steps instead of a bar.
    buf = io.StringIO()
    progress, on_step = training_progress(Console(file=buf, force_terminal=False), steps=20)
    with progress:
        for step in range(1, 21):
            on_step({"step": step, "loss": 1.0, "lr": 1e-3, "tok_s": 10.0})
    assert buf.getvalue().count("step ") == 2
    assert re.search(r"step +20/20 .* \d+:\d\d elapsed, ~0:00 left", buf.getvalue())


def test_answers_too_short_for_any_anchor_are_an_error_not_a_hang(sequences):
    """The trainer samples anchors until a batch fills: with no answer a block long it would
    spin forever, so the pipeline refuses such data with the longest answer's length."""
    from dflash2_mlx.train.batches import sample_anchors
    from dflash2_mlx.train.preflight import check_anchorable

    check_anchorable(sequences, 8)
    longest = max(len(s.tokens) - s.response_start for s in sequences)
    with pytest.raises(DFlash2Error, match=f"the longest: {longest} tokens"):
        check_anchorable(sequences, longest + 2)
    # The bound is sample_anchors' own: at longest + 1 some sequence still has an anchor.
    check_anchorable(sequences, longest + 1)
    assert any(sample_anchors(s, 1, longest + 1, random.Random(0)) for s in sequences)


def test_live_features_are_the_cached_ones_computed_when_read(target, tmp_path):
    """--live-features: a sequence's features are the cache's (one target forward when first
    read, kept for the next reads, the oldest dropped past `keep`)."""
    from dflash2_mlx.train.live import LiveFeatures, LiveSequence

    adapter = TargetAdapter(target, (0, 2))
    seqs = [Sequence_(f"p{i}", 0.0, p + [7, 8, 9], len(p)) for i, p in enumerate(PROMPTS)]
    build_feature_cache(adapter, seqs, tmp_path / "feats", batch=3, log=lambda s: None)
    cached = {s.id: s for s in load_feature_cache(tmp_path / "feats")}
    source = LiveFeatures(adapter, keep=2)
    live = [LiveSequence(s, source) for s in seqs]
    assert source.computed == 0  # nothing runs before a step reads it
    for s in live:
        ref = cached[s.id]
        assert s.tokens.tolist() == ref.tokens.tolist()
        assert s.response_start == ref.response_start and s.greedy is None
        got = s.features
        assert got.dtype == np.float16 and got.shape == ref.features.shape
        np.testing.assert_allclose(
            got.astype(np.float32), ref.features.astype(np.float32), rtol=2e-3, atol=2e-3
        )
    assert source.computed == len(seqs)
    _ = live[-1].features, live[-2].features  # the last two are kept
    assert source.computed == len(seqs)
    _ = live[0].features  # dropped past keep: computed again
    assert source.computed == len(seqs) + 1


def test_train_with_live_features_writes_no_feature_cache(tmp_path):
    """`dflash2 train --live-features`: the held-out features are cached, the training ones
    are computed as steps draw them (no features_train folder); the drafter is written."""
    from dflash2_cli.app import run
    from tiny_pair import save_target

    target_dir = save_target(tmp_path / "target")
    work, out = tmp_path / "work", tmp_path / "drafter"
    args = ["train", str(target_dir), "--out", str(out), "--work", str(work), "--steps", "3"]
    args += ["--prompts", str(_prompt_file(tmp_path / "p.jsonl", 5, "p"))]
    args += ["--heldout", str(_prompt_file(tmp_path / "h.jsonl", 2, "h"))]
    args += ["--batch", "2", "--anchors", "4", "--max-new-tokens", "16", "--layers", "1"]
    args += ["--temperatures", "0", "--layer-ids", "0,2", "--block-size", "4"]
    assert run([*args, "--live-features"]) == 0
    assert load_drafter(out).config.block_size == 4
    assert [p.name for p in work.glob("features_*")] == ["features_heldout_0-2"]
    log = json.loads((out / "training.json").read_text())
    assert log["stages"]["train"]["steps"] == 3 and "features_train" not in log["stages"]
    assert log["pipeline"]["live_features"] is True and "--live-features" in log["train"]["command"]
    assert 1.0 <= log["final"]["train_tau"] <= 4.0


def test_a_new_heldout_set_in_a_reused_work_folder_is_measured_alone(tmp_path):
    """The work folder caches every held-out set it has seen: a run measures τ on its own
    --heldout only (an earlier one's prompts may be this run's training prompts)."""
    from dflash2_cli.app import run
    from tiny_pair import save_target

    from dflash2_mlx.train.pipeline import prepare_data
    from dflash2_mlx.train.pipeline_config import PipelineConfig

    target_dir = save_target(tmp_path / "target")
    work, p = tmp_path / "work", str(_prompt_file(tmp_path / "p.jsonl", 4, "p"))
    first, second = (
        _prompt_file(tmp_path / "h.jsonl", 2, "h"),
        _prompt_file(tmp_path / "q.jsonl", 3, "q"),
    )
    args = ["train", str(target_dir), "--work", str(work), "--steps", "1", "--live-features"]
    args += ["--batch", "2", "--anchors", "4", "--max-new-tokens", "16", "--layers", "1"]
    args += ["--temperatures", "0", "--layer-ids", "0,2", "--block-size", "4"]
    assert run([*args, "--out", str(tmp_path / "a"), "--prompts", p, "--heldout", str(first)]) == 0
    pc = PipelineConfig(
        str(target_dir),
        tmp_path / "b",
        work,
        prompts=f"{p}+{first}",  # the first held-out set now trains
        heldout=str(second),
        max_new_tokens=16,
        temperatures=(0.0,),
        live_features=True,
    )
    tc = TrainConfig(layers=1, block_size=4, target_layer_ids=(0, 2), steps=1)
    data = prepare_data(pc, tc, log=lambda s: None)
    assert sorted(s.id for s in data.heldout) == ["q0", "q1", "q2"]


def test_a_kill_between_the_checkpoint_renames_resumes_from_the_last_good_one(
    target, sequences, tmp_path
):
    tr = _trainer(target, sequences, tmp_path, steps=10)
    tr.run()
    assert (tr.ckpt / "state.json").exists()
    tr.ckpt.rename(tr.ckpt.with_name(tr.ckpt.name + ".old"))  # killed after the first rename
    again = _trainer(target, sequences, tmp_path, steps=20)
    assert again.try_resume() and again.step == 10
    again.run()  # and the next checkpoint replaces it by renames, leaving no .old behind
    assert json.loads((again.ckpt / "state.json").read_text())["step"] == 20
    assert not again.ckpt.with_name(again.ckpt.name + ".old").exists()


def test_a_work_folder_refuses_another_target_answer_length_or_edited_prompt(tmp_path, capsys):
    """Regenerations and features in --work were made for one target, answer length and
    prompt text: a rerun that differs is refused, not trained on the old data as it is."""
    from dflash2_cli.app import run
    from tiny_pair import save_target

    a, b = save_target(tmp_path / "a"), save_target(tmp_path / "b", seed=5)
    work, p = tmp_path / "work", _prompt_file(tmp_path / "p.jsonl", 4, "p")
    h = str(_prompt_file(tmp_path / "h.jsonl", 2, "h"))
    common = ["--work", str(work), "--steps", "1", "--live-features", "--heldout", h]
    common += ["--batch", "2", "--anchors", "4", "--layers", "1", "--temperatures", "0"]
    common += ["--layer-ids", "0,2", "--block-size", "4", "--prompts", str(p)]
    assert (
        run(["train", str(a), "--out", str(tmp_path / "o1"), *common, "--max-new-tokens", "16"])
        == 0
    )
    capsys.readouterr()
    err = _refused(
        [str(b), "--out", str(tmp_path / "o2"), *common, "--max-new-tokens", "16"], capsys
    )
    assert "made with another target" in err and "use a new --work folder" in err
    err = _refused(
        [str(a), "--out", str(tmp_path / "o3"), *common, "--max-new-tokens", "20"], capsys
    )
    assert "made with --max-new-tokens 16 (now 20)" in err
    done = [json.loads(line) for line in (work / "regen_train.jsonl").open()]
    p.write_text(p.read_text().replace("the sea", "a cat"))  # the same ids, other text
    err = _refused(
        [str(a), "--out", str(tmp_path / "o4"), *common, "--max-new-tokens", "16"], capsys
    )
    assert "was answered for other text than it has now" in err
    # a placeholder naming the ids its answer was made for (tools/stage_work_folder.py)
    turn = [{"role": "user", "content": "-"}]
    stand_in = [
        {"id": r["id"], "category": "x", "messages": turn, "prompt_ids": r["prompt_ids"]}
        for r in done
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in stand_in))
    o5 = [str(a), "--out", str(tmp_path / "o5"), *common, "--max-new-tokens", "16"]
    assert run(["train", *o5]) == 0
    assert (work / "regen_train.jsonl").read_text().count("\n") == len(done)  # none again


def test_an_init_from_of_another_kind_is_refused_before_regenerating(
    target, sequences, tmp_path, capsys
):
    from tiny_pair import save_target

    v1 = _trainer(target, sequences, tmp_path / "c", version=1, steps=1).export(tmp_path / "v1")
    target_dir, work = save_target(tmp_path / "target"), tmp_path / "work"
    args = [str(target_dir), "--out", str(tmp_path / "o"), "--work", str(work)]
    args += ["--prompts", str(_prompt_file(tmp_path / "p.jsonl", 3, "p"))]
    args += ["--heldout", str(_prompt_file(tmp_path / "h.jsonl", 2, "h"))]
    args += ["--block-size", "4", "--init-from", str(v1)]
    assert "give --version 1 to start from it" in _refused(args, capsys)
    assert not list(work.glob("regen_*"))  # nothing was regenerated for a run that cannot start
    # its target layers (0, 2) are the run's; others given are refused, naming the flag
    other = _refused([*args, "--version", "1", "--layer-ids", "0,1"], capsys)
    assert "--layer-ids: the --init-from drafter" in other and "trained with 0,2" in other
    assert not list(work.glob("regen_*"))


def test_a_quantized_target_is_refused_before_regenerating(tmp_path, capsys):
    """Most MLX users hold 4-bit copies: the quantized LM head was refused after the
    regeneration and the feature cache (hours on a real model), and said nothing of how."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from tiny_pair import save_target

    target_dir, work = save_target(tmp_path / "target"), tmp_path / "work"
    model, _ = load(str(target_dir))
    nn.quantize(model, group_size=32, bits=4)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(target_dir / "model.safetensors"), weights, {"format": "mlx"})
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg["quantization"] = {"group_size": 32, "bits": 4}
    (target_dir / "config.json").write_text(json.dumps(cfg))
    args = [str(target_dir), "--out", str(tmp_path / "o"), "--work", str(work)]
    args += ["--prompts", str(_prompt_file(tmp_path / "p.jsonl", 3, "p"))]
    args += ["--heldout", str(_prompt_file(tmp_path / "h.jsonl", 2, "h"))]
    said = _refused([*args, "--block-size", "4"], capsys)
    assert "unquantized target" in said and "--dequantize" in said
    assert not list(work.glob("regen_*"))


def test_prompts_that_all_pass_the_length_limit_are_named_not_a_missing_cache(tmp_path):
    from tiny_pair import save_target

    from dflash2_mlx.train.pipeline import prepare_data
    from dflash2_mlx.train.pipeline_config import PipelineConfig

    p = str(_prompt_file(tmp_path / "p.jsonl", 3, "p"))
    pc = PipelineConfig(
        str(save_target(tmp_path / "target")),
        tmp_path / "o",
        tmp_path / "work",
        prompts=p,
        heldout=str(_prompt_file(tmp_path / "h.jsonl", 2, "h")),
        max_new_tokens=8,
        temperatures=(0.0,),
        max_len=6,  # shorter than any chat-templated prompt
        live_features=True,
    )
    tc = TrainConfig(layers=1, block_size=4, target_layer_ids=(0, 2), steps=1)
    with pytest.raises(DFlash2Error, match=rf"{p}: no train prompt and answer fit in 6 tokens"):
        prepare_data(pc, tc, log=lambda s: None)


@pytest.mark.parametrize("broken", ["no weights", "unknown model_type"])
def test_a_target_mlx_lm_cannot_load_is_named_before_anything_is_written(tmp_path, broken):
    from tiny_pair import save_target

    from dflash2_mlx.train.pipeline import prepare_data
    from dflash2_mlx.train.pipeline_config import PipelineConfig

    folder = save_target(tmp_path / "target")
    if broken == "no weights":
        for f in folder.glob("*.safetensors"):
            f.unlink()
    else:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "nosuch"}))
    pc = PipelineConfig(
        str(folder),
        tmp_path / "o",
        tmp_path / "work",
        prompts=str(_prompt_file(tmp_path / "p.jsonl", 3, "p")),
        heldout=str(_prompt_file(tmp_path / "h.jsonl", 2, "h")),
        max_new_tokens=8,
        temperatures=(0.0,),
    )
    tc = TrainConfig(layers=1, block_size=4, target_layer_ids=(0, 2), steps=1)
    with pytest.raises(DFlash2Error, match=rf"{folder}: cannot load the target with mlx-lm"):
        prepare_data(pc, tc, log=lambda s: None)
    assert not (tmp_path / "o").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_kill_mid_training_saves_a_checkpoint_and_the_rerun_resumes(tmp_path, signame):
    """SIGTERM (`kill`, a job scheduler) or SIGHUP (the terminal or ssh session gone) stops as
    Ctrl-C does: the checkpoint is saved at the step reached, the exit status is 128 + the
    signal's number, and the same command resumes there."""
    import signal
    import subprocess
    import sys
    import time

    from tiny_pair import save_target

    target_dir = save_target(tmp_path / "target")
    args = [sys.executable, "-m", "dflash2_cli", "train", str(target_dir), "--out"]
    args += [str(tmp_path / "o"), "--work", str(tmp_path / "w")]
    args += ["--prompts", str(_prompt_file(tmp_path / "p.jsonl", 4, "p"))]
    args += ["--heldout", str(_prompt_file(tmp_path / "h.jsonl", 2, "h"))]
    args += ["--batch", "2", "--anchors", "4", "--max-new-tokens", "16", "--layers", "1"]
    args += ["--temperatures", "0", "--layer-ids", "0,2", "--block-size", "4"]
    proc = subprocess.Popen(
        [*args, "--steps", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # as a terminal's: under `nohup pytest` the child inherits SIGHUP ignored, and keeps it
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    ckpt = tmp_path / "w" / "run-o" / "checkpoint"
    deadline = time.monotonic() + 180
    while not (ckpt / "state.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # training: its first checkpoint (every 100 steps) is written
    signum = getattr(signal, signame)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, out  # 143 / 129: what a scheduler, a shell read
    assert "interrupted: checkpoint saved at step" in out and "rerun the same command" in out
    saved = json.loads((ckpt / "state.json").read_text())
    assert saved["step"] >= 100 and not ckpt.with_name("checkpoint.tmp").exists()
    assert f"checkpoint saved at step {saved['step']}" in out
    again = subprocess.run(
        [*args, "--steps", str(saved["step"] + 1)], capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert f"resumed at step {saved['step']}" in again.stdout + again.stderr


def test_the_model_card_verdict_follows_its_numbers():
    from dflash2_mlx.train.model_card import _verdict

    assert "would not speed decoding up" in _verdict({"proxy_tau": 1.03, "train_tau": 1.0})
    assert "more data would help" in _verdict({"proxy_tau": 1.7, "train_tau": 2.3})
    assert _verdict({"proxy_tau": 1.9, "train_tau": 2.0}) == ""  # no gap: nothing to say


def test_the_model_card_names_the_parts_and_losses_trained():
    """An ablation variant's card says which DFlash2 part stayed neutral and drops the
    selector loss it did not train."""
    from dflash2_mlx.train.model_card import _objective, _parts

    full = TrainConfig(layers=1, block_size=4)
    assert "selector cross-entropy" in _objective(full)
    assert _parts(full) == " (dynamic convs trained, selector trained)"
    neutral = replace(full, selector_weight=0.0, train_conv=False)
    assert "selector" not in _objective(neutral)
    assert _parts(neutral) == " (dynamic convs kept as identity, selector untrained)"
    assert _parts(replace(full, version=1)) == ""


def test_work_must_not_be_a_file_or_hold_a_drafter(tmp_path):
    """--work is deleted once the drafter is final: a drafter's or a model's folder is
    refused (the run used to fill it and then say to delete it)."""
    from dflash2_mlx.train.preflight import check_out

    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    with pytest.raises(ParameterError, match=r"--work .*drafter: holds a model"):
        check_out(tmp_path / "new", drafter, write=False)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ParameterError, match="--work .*afile: is a file"):
        check_out(tmp_path / "new", afile, write=False)
    assert not (tmp_path / "new").exists()


def test_skipped_prompt_lines_are_reported_once(tmp_path):
    """The preflight's read of the prompt files is silent; the run's own read reports a
    skipped line (it used to be reported twice)."""
    import warnings

    from dflash2_mlx.prompts import load_prompts
    from dflash2_mlx.train.preflight import check_heldout_apart

    prompts = _prompt_file(tmp_path / "p.jsonl", 2, "p")
    prompts.write_text(prompts.read_text() + "{not json\n")
    held = _prompt_file(tmp_path / "h.jsonl", 1, "h")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_heldout_apart(str(prompts), str(held), skip_bad=True)
    with pytest.warns(UserWarning, match=r"p.jsonl:3"):
        load_prompts(str(prompts), skip_bad=True)


def test_default_layer_ids_are_distinct_on_a_shallow_target_and_repeats_are_refused(target):
    """The reference spread (layers 1..T-3) names layer 1 five times on 4 layers."""
    adapter = TargetAdapter(target, (0, 2))
    cfg = TrainConfig(layers=1, block_size=4, mask_token_id=95, steps=1)
    assert drafter_config_for(adapter, TARGET_CFG, cfg).target_layer_ids == (1,)
    deep = TargetAdapter(tiny.make_target("llama", layers=12), (0, 2))
    assert drafter_config_for(deep, TARGET_CFG, cfg).target_layer_ids == (1, 3, 5, 7, 9)
    for kl in (dict(distill_weight=1.0), dict(fixed_ratio=0.5)):  # a KL reads the last layer
        kd = replace(cfg, **kl)
        assert drafter_config_for(deep, TARGET_CFG, kd).target_layer_ids == (1, 3, 5, 7, 11)
    off = replace(cfg, fixed_ratio=0.5, fixed_distill_weight=0.0)
    assert drafter_config_for(deep, TARGET_CFG, off).target_layer_ids == (1, 3, 5, 7, 9)
    repeated = TrainConfig(layers=1, block_size=4, mask_token_id=95, target_layer_ids=(0, 2, 0))
    with pytest.raises(DFlash2Error, match=r"\[0, 2, 0\] name a layer twice"):
        drafter_config_for(adapter, TARGET_CFG, repeated)


def test_the_closing_note_never_says_to_delete_a_users_files(tmp_path):
    """`--work .` in a folder of one's own: the note names train's files to delete, not the
    folder; a folder of train's files alone may go whole."""
    from dflash2_cli.train import _work_note

    work = tmp_path / "w"
    (work / "run-out").mkdir(parents=True)
    for name in ("regen_train.jsonl", "features_train_abc", "work.json"):
        (work / name).write_text("x")
    assert _work_note(work).endswith("delete it once this drafter is final")
    (work / ".git").mkdir()  # a repository's folder is one's own, dotted or not
    assert "not train's: .git" in _work_note(work)
    (work / ".git").rmdir()
    (work / "thesis.tex").write_text("mine")
    note = _work_note(work)
    assert "delete it once" not in note and "regen_*" in note and "run-*" in note, note
    assert "other files there are not train's: thesis.tex" in note, note


def test_an_unwritable_work_or_out_path_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """A read-only --work or --out (a file system mounted read-only, a vanished disk): the path
    and why on one line, no traceback."""  # as root, chmod would not stop the writes
    from dflash2_cli.app import run
    from dflash2_mlx.train import pipeline
    from tiny_pair import save_target

    target_dir = save_target(tmp_path / "target")
    where = tmp_path / "w" / "work.json"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(where))

    monkeypatch.setattr(pipeline, "run_pipeline", read_only)
    argv = ["train", str(target_dir), "--out", str(tmp_path / "d"), "--work", str(where.parent)]
    code = run([*argv, "--steps", "2"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "Traceback" not in err, err
    assert f"error: {where}: Read-only file system; what was done so far is kept" in err, err


def test_the_regeneration_lines_say_the_time_left(tmp_path, monkeypatch):
    """At the pass's rate so far, over this call's prompts (a resumed pass counts from its
    restart: the prompts done before it are not in `finished`)."""
    from dflash2_mlx.train import regenerate

    now = [0.0]
    monkeypatch.setattr(regenerate.time, "perf_counter", lambda: now[0])
    lines: list[str] = []
    progress = regenerate._Progress(lines.append, start=0.0)
    progress.begin(0.0, todo=900, done=100)
    with open(tmp_path / "answers.jsonl", "w") as fh:
        now[0] = 100.0
        progress.sync_and_report(fh, 0.0, 100, 900)
    assert lines[-1].startswith("[regen] T=0 100/900 done") and lines[-1].endswith(
        "~13:20 left at T=0"
    )
