"""Fixed text labelled by the target: labels and masks against a real greedy rollout, the
masked loss, streamed shard features (bounded disk, resumable) and mixed batches, on tiny
random models."""

import json
import random

import mlx.core as mx
import numpy as np
import pytest
import tiny
from tiny_pair import save_tokenizer

from dflash2_mlx.errors import DFlash2Error
from dflash2_mlx.target.adapter import TargetAdapter
from dflash2_mlx.train.features import Sequence_, build_feature_cache, load_feature_cache
from dflash2_mlx.train.fixed_text import (
    anchor_pool,
    block_labels,
    corpus_sequences,
    corpus_sources,
    render_with_spans,
    sample_text_anchors,
    supervised_lengths,
)
from dflash2_mlx.train.objective import decay_weights, loss_terms
from dflash2_mlx.train import stream as stream_mod
from dflash2_mlx.train.stream import FixedTextStream, plan_shards
from dflash2_mlx.train.trainer import (
    TrainConfig,
    Trainer,
    drafter_config_for,
    init_drafter,
    make_blocks,
)

TARGET_CFG = {
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "head_dim": 16,
}
B = 8


@pytest.fixture(scope="module")
def target():
    return tiny.make_target("llama")


def _text(target, prompt, n=40, edits=(12, 25)):
    """The target's greedy continuation of `prompt` with a few tokens replaced: fixed text
    that follows the greedy path only in stretches."""
    toks = prompt + tiny.greedy_reference(target, prompt, n)
    for e in edits:
        toks[len(prompt) + e] = (toks[len(prompt) + e] + 7) % 90
    return toks


@pytest.fixture(scope="module")
def fixed(target, tmp_path_factory):
    """Stored fixed-text sequences (layers 0 and 3: 3 is the last, for the KL)."""
    prompts = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9], [2, 7, 1, 8, 2, 8], [60, 61, 62]]
    seqs = [
        Sequence_(
            f"t{i}", 0.0, _text(target, p, edits=(12 + i, 25 - i)), len(p), ((len(p), len(p) + 41),)
        )
        for i, p in enumerate(prompts)
    ]
    folder = tmp_path_factory.mktemp("fixed")
    build_feature_cache(
        TargetAdapter(target, (0, 3)), seqs, folder, batch=3, greedy=True, log=lambda s: None
    )
    return load_feature_cache(folder)


def _brute_labels(tokens, greedy, a):
    labels, mask, on_path = [], [], True
    for k in range(1, B):
        labels.append(int(greedy[a + k - 1]))
        mask.append(1.0 if on_path else 0.0)
        on_path = on_path and tokens[a + k] == greedy[a + k - 1]
    return labels, mask


def test_greedy_labels_are_the_targets_argmax(target, fixed):
    for s in fixed:
        full = np.array(target(mx.array([s.tokens.tolist()]))[0])
        np.testing.assert_array_equal(s.greedy, full.argmax(-1))
        assert s.spans == ((s.response_start, s.response_start + 41),)


def test_supervised_labels_equal_a_greedy_rollout_from_the_anchor(target, fixed):
    """Exact by construction: every supervised label is what greedy decoding from x[..a]
    emits at that block position; the mask ends right after the first off-path position."""
    checked_partial = 0
    for s in fixed:
        anchors = list(range(s.response_start - 1, len(s.tokens) - B + 1))
        labels, mask = block_labels(s.tokens, s.greedy, anchors, B)
        for j, a in enumerate(anchors):
            assert (labels[j].tolist(), mask[j].tolist()) == _brute_labels(s.tokens, s.greedy, a)
            rollout = tiny.greedy_reference(target, s.tokens[: a + 1].tolist(), B - 1)
            m = int(mask[j].sum())
            assert labels[j][:m].tolist() == rollout[:m]
            assert m >= 1 and mask[j][:m].all() and not mask[j][m:].any()
            checked_partial += m < B - 1
    assert checked_partial > 10  # the edits really cut blocks short
    s = fixed[0]
    np.testing.assert_array_equal(
        supervised_lengths(s.tokens, s.greedy, B)[anchors[:3]], mask[:3].sum(-1)
    )


def test_regenerated_text_is_supervised_in_full(target):
    toks = [4, 5, 6] + tiny.greedy_reference(target, [4, 5, 6], 20)
    g = np.array(target(mx.array([toks]))[0]).argmax(-1)
    _, mask = block_labels(np.array(toks), g, range(2, len(toks) - B + 1), B)
    assert mask.all()


def test_anchors_stay_in_assistant_spans_and_prefer_agreement():
    tokens = np.arange(40)
    greedy = np.full(40, -1)
    greedy[20:30] = tokens[21:31]  # the text agrees with the target on positions 21..30
    pool = anchor_pool(40, [(5, 12), (18, 36)], 5, B)
    assert pool.tolist() == list(range(4, 11)) + list(range(17, 33))
    rng = random.Random(0)
    picks = [
        a
        for _ in range(200)
        for a in sample_text_anchors(tokens, greedy, [(5, 12), (18, 36)], 5, 4, B, rng)
    ]
    assert set(picks) <= set(pool.tolist())
    heavy = sum(20 <= a <= 28 for a in picks) / len(picks)
    assert heavy > 9 / len(pool) * 1.5  # weighted by exact labels, not uniform
    assert sample_text_anchors(tokens[:6], greedy[:6], None, 1, 4, B, rng) is None


def test_masked_positions_do_not_touch_the_loss(target, fixed):
    d = tiny.make_drafter(2, block_size=B, layer_ids=(0, 3))
    d.bind(TargetAdapter(target, (0, 3)).binding())
    s, anchors = fixed[0], [6, 15, 30]
    scale = mx.ones(s.features.shape[1])
    b = make_blocks([s], [anchors], B, 95, scale)
    assert b.fixed and 0 < b.mask.sum().item() < b.mask.size
    other = np.array(b.labels)
    other[np.array(b.mask) == 0] = 1  # change every unsupervised label
    b2 = make_blocks([s], [anchors], B, 95, scale)
    b2.labels = mx.array(other)
    w = decay_weights(B)
    l1, _ = loss_terms(d, b, w, None)
    l2, _ = loss_terms(d, b2, w, None)
    np.testing.assert_allclose(l1.item(), l2.item(), rtol=1e-6)
    b2.labels = mx.array(np.where(np.array(b.mask) == 1, 1, np.array(b.labels)))
    assert abs(loss_terms(d, b2, w, None)[0].item() - l1.item()) > 1e-3
    with pytest.raises(DFlash2Error, match="mixes fixed text and regenerations"):
        regen = type(s)(s.id, 0.0, s.tokens, s.response_start, s.features)
        make_blocks([s, regen], [anchors, anchors], B, 95, scale)


def _seqs(target, n=6):
    prompts = [[3 + i, 14, 15 + i, 9] for i in range(n)]
    return [
        Sequence_(f"f{i}", 0.0, _text(target, p, 30, edits=(8, 17)), 4, ((4, 34),))
        for i, p in enumerate(prompts)
    ]


def _regen(target):
    adapter = TargetAdapter(target, (0, 3))
    seqs = [
        Sequence_(f"r{i}", 0.0, [7 + i, 8, 9] + tiny.greedy_reference(target, [7 + i, 8, 9], 30), 3)
        for i in range(4)
    ]
    return adapter, seqs


def _mixed_trainer(target, tmp_path, steps, ratio=0.5, resume_stream=None):
    adapter, regen = _regen(target)
    folder = tmp_path / "regen"
    build_feature_cache(adapter, regen, folder, log=lambda s: None)
    per_token = 2 * 64 * 2 + 16
    stream = FixedTextStream(
        adapter,
        _seqs(target),
        tmp_path / "stream",
        max_disk_bytes=per_token * 70,
        passes=1.0,
        log=lambda s: None,
    )
    cfg = TrainConfig(
        version=2,
        layers=2,
        block_size=B,
        target_layer_ids=(0, 3),
        mask_token_id=95,
        steps=steps,
        batch_seqs=4,
        anchors_per_seq=6,
        eval_every=steps,
        checkpoint_every=3,
        lr=3e-3,
        negatives=16,
        selector_rank=8,
        fixed_ratio=ratio,
    )
    d = init_drafter(drafter_config_for(adapter, TARGET_CFG, cfg), cfg)
    train = load_feature_cache(folder)
    return Trainer(adapter, d, train, train, cfg, tmp_path / "run", lambda s: None, stream), stream


def test_mixed_training_streams_shards_within_the_disk_bound_and_resumes(target, tmp_path):
    tr, stream = _mixed_trainer(target, tmp_path, steps=9)
    assert len(stream.shards) == 3 and plan_shards(_seqs(target), 70) == stream.shards
    seen, recs = [], []

    def on_step(rec):
        recs.append(rec)
        seen.append(sorted(p.name for p in (tmp_path / "stream").glob("shard_*")))

    tr.run(on_step)
    # 18 fixed draws of a stream of 6 sequences in 3 shards, one pass a shard (the move to
    # the next shard happens at the next draw)
    assert stream.state() == {"shard": 2, "draws": 2, "epoch": 2}
    assert all(len(s) <= 1 for s in seen)  # one shard of features on disk at a time
    assert {x for s in seen for x in s} == {stream.shard_dir(i).name for i in range(3)}
    assert all(np.isfinite(r["loss"]) and r["distill"] > 0 for r in recs)
    batch = tr.next_batch()
    assert [b.fixed for b in batch] == [True, True, False, False]
    # A rerun resumes the stream where the checkpoint left it.
    again, stream2 = _mixed_trainer(target, tmp_path, steps=12)
    assert again.try_resume() and again.step == 9
    assert stream2.state() == {"shard": 2, "draws": 2, "epoch": 2}
    again.run()
    assert again.step == 12


def test_a_lone_shard_is_computed_once_for_every_pass(target, tmp_path, monkeypatch):
    adapter, _ = _regen(target)
    built = []
    real = stream_mod.build_feature_cache
    monkeypatch.setattr(
        stream_mod, "build_feature_cache", lambda *a, **k: built.append(1) or real(*a, **k)
    )
    stream = FixedTextStream(
        adapter, _seqs(target, 2), tmp_path / "stream", max_disk_bytes=10**9, log=lambda s: None
    )
    rng = random.Random(0)
    for _ in range(13):  # passes=2: 3 passes and more over one shard of 2 sequences
        stream.draw(rng)
    assert len(stream.shards) == 1 and stream.state()["epoch"] == 3
    assert built == [1] and stream.shard_dir(0).is_dir()


def test_a_resume_under_another_disk_bound_computes_its_shard_afresh(target, tmp_path):
    """The old plan's half-computed shard 1 held other sequences: merged into the new plan's
    shard 1, it went over the new bound."""
    adapter, _ = _regen(target)
    per_token = 2 * 64 * 2 + 16

    def stream(tokens):
        folder = tmp_path / "stream"
        return FixedTextStream(adapter, _seqs(target), folder, max_disk_bytes=per_token * tokens)

    old = stream(140)
    old.log = new_log = lambda s: None
    old.pool()
    new = stream(70)
    new.log = new_log
    assert old.shards != new.shards and old.shard_dir(0) != new.shard_dir(0)
    assert [s.id for s in new.pool()] == [s.id for s in new.shards[0]]
    assert not old.shard_dir(0).exists()


def test_fixed_ratio_needs_a_stream_and_keeps_regenerations(target, tmp_path):
    adapter, regen = _regen(target)
    build_feature_cache(adapter, regen, tmp_path / "r", log=lambda s: None)
    train = load_feature_cache(tmp_path / "r")
    for ratio, msg in ((0.5, "needs a fixed-text stream"), (1.0, "keeps some regenerations")):
        cfg = TrainConfig(
            target_layer_ids=(0, 3),
            mask_token_id=95,
            fixed_ratio=ratio,
            selector_rank=8,
            negatives=16,
        )
        d = init_drafter(drafter_config_for(adapter, TARGET_CFG, cfg), cfg)
        stream = (
            None
            if ratio == 0.5
            else FixedTextStream(adapter, _seqs(target), tmp_path / "s", max_disk_bytes=10**6)
        )
        with pytest.raises(DFlash2Error, match=msg):
            Trainer(adapter, d, train, train, cfg, tmp_path / "run", lambda s: None, stream)
    with pytest.raises(DFlash2Error, match="less than the longest sequence.s"):
        FixedTextStream(adapter, _seqs(target), tmp_path / "s", max_disk_bytes=1000)


def test_chat_rendering_spans_and_corpus_sequences(tmp_path):
    from transformers import AutoTokenizer

    save_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    msgs = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "the cat is red"},
        {"role": "user", "content": "why"},
        {"role": "assistant", "content": "the sun"},
    ]
    ids, spans = render_with_spans(tok, msgs, 100)
    assert [tok.decode(ids[s:e]) for s, e in spans] == [
        "the cat is red <|im_end|>",
        "the sun <|im_end|>",
    ]
    ids_cut, spans_cut = render_with_spans(tok, msgs, 14)
    assert ids_cut == ids[:14] and spans_cut == [spans[0]]  # the second turn is cut off
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "messages": msgs}) + "\n" for i in range(5)))
    seqs = corpus_sequences(tok, path, max_tokens=40, seed=1)
    assert (
        len(seqs) == 2 and seqs[0].spans == tuple(spans) and seqs[0].response_start == spans[0][0]
    )
    entry = {"source": "wiki", "package": "ovos-wiki", "version": "1.0", "licence": "CC BY-SA"}
    (tmp_path / "manifest.json").write_text(json.dumps({"sources": [entry]}))
    assert corpus_sources(tmp_path) == ["wiki (ovos-wiki 1.0, CC BY-SA)"]  # for the card
    assert corpus_sources(path) == []  # JSONL files: no manifest
    path.write_text('{"id": 1}\n')
    with pytest.raises(DFlash2Error, match=r"c.jsonl:1: not a corpus record.*messages missing"):
        corpus_sequences(tok, path, max_tokens=40)
    for messages, problem in (
        ("hello", "must be a list of {role, content} objects"),
        ([{"content": "hi"}], r"\[0\] needs a string role and a string content"),
        ([{"role": "user", "content": "hi"}], "hold no assistant turn"),
    ):
        path.write_text(json.dumps({"id": "r", "messages": messages}) + "\n")
        with pytest.raises(DFlash2Error, match=rf"c.jsonl:1: messages {problem}"):
            corpus_sequences(tok, path, max_tokens=40)


def test_train_command_mixes_a_corpus_and_deletes_its_features(tmp_path, capsys):
    from dflash2_cli.app import run
    from tiny_pair import save_target

    target_dir = save_target(tmp_path / "target")
    words = "the cat is red and the dog is blue one two three yes no maybe".split()

    def chat(i, n):
        return [
            {"role": "user", "content": " ".join(words[(i + k) % len(words)] for k in range(4))},
            {
                "role": "assistant",
                "content": " ".join(words[(3 * i + k) % len(words)] for k in range(n)),
            },
        ]

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "c.jsonl").write_text(
        "".join(json.dumps({"id": f"c{i}", "messages": chat(i, 20)}) + "\n" for i in range(8))
    )
    prompts, heldout = tmp_path / "p.jsonl", tmp_path / "h.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "category": "chat", "messages": chat(i, 0)[:1]}) + "\n"
            for i in range(4)
        )
    )
    heldout.write_text(
        "".join(
            json.dumps({"id": f"h{i}", "category": "chat", "messages": chat(i, 0)[:1]}).replace(
                '"content": "', '"content": "held out '
            )
            + "\n"
            for i in range(2)
        )
    )
    out, work = tmp_path / "drafter", tmp_path / "work"
    common = [
        "--work",
        str(work),
        "--prompts",
        str(prompts),
        "--heldout",
        str(heldout),
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
        "0,3",
        "--block-size",
        "4",
        "--regen-batch",
        "4",
    ]
    assert (
        run(
            [
                "train",
                str(target_dir),
                "--out",
                str(out),
                "--steps",
                "4",
                *common,
                "--corpus",
                str(corpus),
                "--stream-disk-gb",
                "0.00003",
                "--stream-passes",
                "0.5",
            ]
        )
        == 0
    )
    log = json.loads((out / "training.json").read_text())
    c = log["stages"]["corpus"]
    assert c["sequences"] == 8 and c["shards"] > 1 and c["stream_at_end"]["shard"] >= 1
    assert all("distill" in h for h in log["history"])
    assert "50% of each batch fixed text" in (out / "README.md").read_text()
    assert not list(work.glob("stream_*"))  # the features are gone after training
    # the draft vocabulary holds what the corpus's answers taught, not only the regenerations'
    from transformers import AutoTokenizer

    vocab = json.loads((out / "draft_vocab.json").read_text())
    assert "and of the 8 --corpus answers" in vocab["source"]
    answers = " ".join(chat(i, 20)[1]["content"] for i in range(8))
    taught = AutoTokenizer.from_pretrained(str(target_dir))(answers)["input_ids"]
    assert set(taught) <= set(vocab["token_ids"])
    none = ["--corpus", str(corpus), "--stream-disk-gb", "0"]  # refused before regenerating
    assert run(["train", str(target_dir), "--out", str(tmp_path / "z"), *common, *none]) == 2
    assert "--stream-disk-gb 0 holds 0 tokens of features" in capsys.readouterr().err
    assert run(["train", str(target_dir), "--out", str(out), "--corpus-ratio", "0.3", *common]) == 2
    assert "--corpus-ratio only applies with --corpus" in capsys.readouterr().err
    # given at its default value it is still given; a ratio that rounds to no sequence is refused
    assert run(["train", str(target_dir), "--out", str(out), "--corpus-ratio", "0.5", *common]) == 2
    assert "--corpus-ratio only applies with --corpus" in capsys.readouterr().err
    few = ["--corpus", str(out), "--corpus-ratio", "0.4", "--batch", "1"]
    assert run(["train", str(target_dir), "--out", str(out), *common, *few]) == 2
    assert "rounds to no corpus sequence per batch" in capsys.readouterr().err


def test_a_corpus_file_with_a_byte_order_mark_reads(tmp_path):
    from dflash2_mlx.train.fixed_text import read_corpus

    rec = {
        "id": "a",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }
    f = tmp_path / "c.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + (json.dumps(rec) + "\n").encode())
    assert read_corpus([f]) == [rec]
