"""The block-size autotuner: the decision is the argmax of the expected-throughput formula,
per-position acceptance from round counts, quantization detection and the cap at 5, profiles
stored and found again by key (and ignored when any part of the key changes), and
`bench --autotune` end to end on a tiny pair (then `bench` without --block uses the profile)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import mlx.nn as nn
import pytest

import dflash2_mlx as d2
from dflash2_cli.app import run
from dflash2_mlx import autotune as A
from dflash2_mlx import costs, profiles
from tiny import make_drafter, make_target
from tiny_pair import save_pair

VERIFY = {1: 10.0, 2: 10.5, 3: 11.0, 4: 11.6, 5: 12.5, 6: 14.0, 7: 16.0, 8: 19.0}
DRAFT = {1: 0.0, 2: 2.0, 3: 2.1, 4: 2.2, 5: 2.3, 6: 2.4, 7: 2.5, 8: 2.6}
PROBS = [0.95, 0.9, 0.9, 0.85, 0.85, 0.8, 0.8]
pytestmark = pytest.mark.usefixtures("dflash2_home")  # profiles go to a private cache


def brute_force(verify, draft, probs, blocks):
    """The formula written out independently: E[tokens at b] / (draft + verify)."""

    def e(b):
        total = 1.0
        for k in range(1, b):
            prod = 1.0
            for j in range(k):
                prod *= probs[j]
            total += prod
        return total

    scores = {b: e(b) / (verify[b] + (draft[b] if b > 1 else 0.0)) for b in blocks}
    return max(blocks, key=lambda b: (scores[b], -b)), scores


@pytest.fixture(scope="module")
def llama_pair():
    return d2.Pair.from_models(make_target("llama"), None, make_drafter(2, block_size=8))


@pytest.fixture(scope="module")
def quant_pair():
    model = make_target("llama")
    nn.quantize(model, group_size=32, bits=4)
    return d2.Pair.from_models(model, None, make_drafter(2, block_size=8))


# ------------------------------------------------------------------------------ the decision
def test_expected_tokens_and_acceptance_probs():
    assert A.expected_tokens([0.5, 0.5], 1) == 1.0
    assert A.expected_tokens([0.5, 0.5], 3) == pytest.approx(1.75)
    assert A.expected_tokens([1.0] * 7, 8) == 8.0
    probs, counts = A.acceptance_probs([(3, 0), (3, 1), (3, 3), (3, 2)], 3)
    assert probs == pytest.approx([0.75, 2 / 3, 0.5]) and counts == [4, 3, 2]
    # A round that drafted fewer (cut short) does not count at positions it never drafted.
    probs, counts = A.acceptance_probs([(1, 1), (3, 3)], 3)
    assert probs == [1.0, 1.0, 1.0] and counts == [2, 1, 1]
    assert A.acceptance_probs([], 2) == ([0.0, 0.0], [0, 0])


def test_choose_block_is_the_argmax_of_the_formula():
    choice = A.choose_block(VERIFY, DRAFT, PROBS, max_block=8)
    best, scores = brute_force(VERIFY, DRAFT, PROBS, range(1, 9))
    assert choice.block == best
    for row in choice.rows:
        assert row.expected_tps == pytest.approx(1000 * scores[row.block], rel=1e-3)
        assert row.round_ms == pytest.approx(VERIFY[row.block] + DRAFT[row.block])


@pytest.mark.parametrize(
    "probs, verify, draft, blocks",
    [
        ([0.0] * 7, VERIFY, DRAFT, range(1, 9)),  # nothing accepted: park at block 1
        ([0.99] * 7, {b: 10.0 for b in range(1, 9)}, {b: 1.0 for b in range(1, 9)}, range(1, 9)),
        ([0.6] * 7, {b: 10.0 + 3 * b for b in range(1, 9)}, DRAFT, range(1, 9)),
        ([0.9, 0.2, 0.9, 0.9, 0.9, 0.9, 0.9], VERIFY, DRAFT, range(1, 9)),
    ],
)
def test_choose_block_matches_brute_force(probs, verify, draft, blocks):
    assert (
        A.choose_block(verify, draft, probs, max_block=8).block
        == brute_force(verify, draft, probs, blocks)[0]
    )


def test_lookup_rounds_cost_no_draft_pass():
    """With half the rounds drafted by lookup, the expected draft cost per round halves; a
    draft cost that parks the drafter alone no longer does."""
    verify = {b: 10.0 for b in range(1, 9)}
    draft = {b: 6.0 for b in range(1, 9)}
    probs = [0.3] * 7  # E(8) = 1.43 tokens a round
    alone = A.choose_block(verify, draft, probs, max_block=8)
    shared = A.choose_block(verify, draft, probs, max_block=8, draft_share=0.25)
    assert alone.block == 1 and shared.block == 8  # 1.43 / 16 < 1 / 10 < 1.43 / 11.5
    assert shared.rows[2].draft_ms == pytest.approx(1.5)


def test_verify_cost_between_and_beyond_the_measured_widths():
    ms = {1: 10.0, 2: 11.0, 4: 13.0, 8: 21.0}
    assert A.verify_at(ms, 4) == 13.0
    assert A.verify_at(ms, 3) == pytest.approx(12.0)
    assert A.verify_at(ms, 6) == pytest.approx(17.0)
    assert A.verify_at(ms, 12) == pytest.approx(29.0)  # along the last two measured widths


def test_choose_lookup_block_replays_each_round_cut_at_each_width():
    """Brute force: a round that proposed d and had a accepted commits min(a, L-1) + 1 at L and
    costs verify(min(d, L-1) + 1); the best tokens per ms wins, ties to the wider block."""
    verify = {w: 10.0 + 0.5 * w for w in range(1, 33)}
    rounds = [(31, 31), (20, 3), (15, 15), (6, 0), (2, 2), (31, 10)]
    choice = A.choose_lookup_block(verify, rounds, [2, 4, 8, 16, 32])

    def rate(L):
        tokens = sum(min(a, L - 1) + 1 for _, a in rounds)
        return tokens / sum(verify[min(d, L - 1) + 1] for d, _ in rounds)

    assert choice.lookup_block == max([2, 4, 8, 16, 32], key=lambda L: (rate(L), L))
    for row in choice.rows:
        assert row.expected_tps == pytest.approx(1000 * rate(row.lookup_block), rel=1e-3)
    # Verify cost that grows fast with width: short lookup blocks win.
    steep = {w: 10.0 * w for w in range(1, 33)}
    assert (
        A.choose_lookup_block(steep, [(31, 0)] * 9 + [(31, 31)], [2, 4, 8, 16, 32]).lookup_block
        == 2
    )
    # Flat cost, nothing longer than 5 proposed: every block from 6 on ties; the widest wins.
    assert A.choose_lookup_block({1: 5.0, 40: 5.0}, [(5, 5)], [4, 6, 32]).lookup_block == 32
    assert A.choose_lookup_block(verify, [], [4, 8]).lookup_block is None


def test_a_lookup_block_is_not_chosen_from_a_handful_of_rounds():
    """One lookup round in a short calibration chose (and stored) a lookup block that every
    later run used: fewer than MIN_LOOKUP_ROUNDS keep the engine's default."""
    from types import SimpleNamespace

    pair = SimpleNamespace(decoder=SimpleNamespace(lookup=3))
    verify = {w: 10.0 + w for w in range(1, 33)}
    few = {"lookup_counts": [[15, 5, 1]], "lookup_block": 16}
    out = A._lookup_profile(pair, verify, few, [4, 8, 16])
    assert out["chosen"] is None and "1 lookup rounds" in out["reason"] and out["table"]
    enough = {"lookup_counts": [[15, 5, A.MIN_LOOKUP_ROUNDS]], "lookup_block": 16}
    assert A._lookup_profile(pair, verify, enough, [4, 8, 16])["chosen"] == 8


def test_the_profile_records_the_lookup_block(llama_pair, monkeypatch, tmp_path, steady_timings):
    _fake_measurements(monkeypatch, best_block=6)
    calib = A.calibrate

    def with_lookups(pair, prompts, block, **kw):
        out = calib(pair, prompts, block, **kw)  # the fake above
        out.update(
            lookup_block=kw["lookup_block"],
            lookup_rounds=3 * A.MIN_LOOKUP_ROUNDS,
            lookup_tau=9.0,
            lookup_counts=[[31, 31, 2 * A.MIN_LOOKUP_ROUNDS], [31, 0, A.MIN_LOOKUP_ROUNDS]],
        )
        return out

    monkeypatch.setattr(A, "calibrate", with_lookups)
    profile = A.autotune(llama_pair, [], target="org/t", drafter="org/d", max_block=8)
    lookup = profile["lookup"]
    assert lookup["calibration_block"] == max(A.LOOKUP_WIDTHS)
    assert lookup["candidates"] == sorted(set(range(2, 9)) | set(A.LOOKUP_WIDTHS))
    assert profile["chosen_lookup_block"] == lookup["chosen"] == max(A.LOOKUP_WIDTHS)  # flat cost
    assert [r["block"] for r in profile["table"]] == list(range(1, 9))  # the drafter's, apart
    root = tmp_path / "profiles"
    A.save_profile(profile, root)
    assert A.recommended_lookup_block(llama_pair, "org/t", "org/d", root=root) == 32
    assert A.recommended_block(llama_pair, "org/t", "org/d", root=root) == 6
    assert A.recommended_lookup_block(llama_pair, "org/t", "org/x", root=root) is None


def test_cap_limits_the_choice_but_keeps_the_curve():
    flat = {b: 10.0 for b in range(1, 9)}
    free = A.choose_block(flat, DRAFT, [0.99] * 7, max_block=8)
    assert free.block == 8
    capped = A.choose_block(flat, DRAFT, [0.99] * 7, max_block=8, cap=5)
    assert capped.block == 5 and capped.cap == 5
    assert len(capped.rows) == 8 and [r.allowed for r in capped.rows] == [True] * 5 + [False] * 3


# ------------------------------------------------------------------------------ quantization
def test_quantization_is_detected(llama_pair, quant_pair):
    assert A.quantized_layers(llama_pair.model) == []
    assert not A.is_quantized(A.quant_signature(llama_pair))
    groups = A.quantized_layers(quant_pair.model)
    assert {(g["bits"], g["group_size"], g["mode"]) for g in groups} == {(4, 32, "affine")}
    assert {g["kind"] for g in groups} == {"Linear", "Embedding"}
    sig = A.quant_signature(quant_pair)
    assert A.is_quantized(sig) and sig["drafter"]["quantized"] == []
    assert "q4 g32 affine" in A.describe_quant(sig)


def _fake_measurements(monkeypatch, best_block=8):
    """Costs and acceptance under which `best_block` wins without a cap."""
    monkeypatch.setattr(
        costs,
        "verify_costs",
        lambda pair, widths, **kw: {
            "context": 8,
            "repeats": 1,
            "ms": {w: 10.0 for w in widths},
            "ratio": {w: 1.0 for w in widths},
        },
    )
    monkeypatch.setattr(
        costs,
        "draft_costs",
        lambda pair, blocks, **kw: {
            "context": 8,
            "repeats": 1,
            "feature_rows": 2,
            "ms": {b: (0.0 if b == 1 else 1.0) for b in blocks},
        },
    )
    probs = [0.99] * (best_block - 1) + [0.0] * (8 - best_block)
    monkeypatch.setattr(
        A,
        "calibrate",
        lambda pair, prompts, block, **kw: {
            "block": block,
            "prompts": 0,
            "max_tokens": 8,
            "rounds": 100,
            "tau": 5.0,
            "drafter_share": 1.0,
            "position_probs": probs[: block - 1],
            "position_rounds": [100] * (block - 1),
        },
    )


def test_quantized_target_caps_the_block_at_5(quant_pair, llama_pair, monkeypatch, steady_timings):
    _fake_measurements(monkeypatch)
    q = A.autotune(quant_pair, [], target="t", drafter="d")
    assert q["cap"] == 5 and q["chosen_block"] == 5 and "q4 g32 affine" in q["cap_reason"]
    free = A.autotune(llama_pair, [], target="t", drafter="d")
    assert free["cap"] is None and free["chosen_block"] == 8


# ------------------------------------------------------------------------------ profiles
def test_profile_is_stored_found_and_ignored_when_the_key_changes(
    llama_pair, quant_pair, monkeypatch, tmp_path, steady_timings
):
    _fake_measurements(monkeypatch, best_block=6)
    profile = A.autotune(llama_pair, [], target="org/target", drafter="org/drafter")
    assert profile["chosen_block"] == 6
    root = tmp_path / "profiles"
    path = A.save_profile(profile, root)
    assert path.parent == root and json.loads(path.read_text())["key"] == profile["key"]
    assert A.recommended_block(llama_pair, "org/target", "org/drafter", root=root) == 6
    # Other models, or the same target quantized: another key, no recommendation.
    assert A.recommended_block(llama_pair, "org/target", "org/other", root=root) is None
    assert A.recommended_block(llama_pair, "org/other", "org/drafter", root=root) is None
    assert A.recommended_block(quant_pair, "org/target", "org/drafter", root=root) is None
    # Another mlx version or device: no recommendation either.
    device_key = profiles.device_key
    monkeypatch.setattr(profiles, "device_key", lambda: "gpu Some Other Chip")
    assert A.recommended_block(llama_pair, "org/target", "org/drafter", root=root) is None
    monkeypatch.setattr(profiles, "device_key", device_key)
    # Another OpenBLAS kernel set (OPENBLAS_CORETYPE) times the CPU differently: another key.
    if profiles.device_key().startswith("cpu"):
        from dflash2_mlx import _blas

        info = _blas.info()
        other = dataclasses.replace(info, core=f"Not{info.core}")
        monkeypatch.setattr(_blas, "info", lambda: other)
        assert f"Not{info.core}" in profiles.device_key()
        assert A.recommended_block(llama_pair, "org/target", "org/drafter", root=root) is None
        # and so does the shim's kernel over another number of threads
        more = dataclasses.replace(info, kernel="avx2", kernel_threads=info.kernel_threads + 2)
        monkeypatch.setattr(_blas, "info", lambda: more)
        assert f" avx2 x{info.kernel_threads + 2}" in profiles.device_key()
        assert A.recommended_block(llama_pair, "org/target", "org/drafter", root=root) is None
        monkeypatch.setattr(_blas, "info", lambda: info)
    # The default root is cache_root()/autotune; a corrupt file counts as no profile.
    default = A.save_profile(profile)
    assert default.parent == Path(str(tmp_path / "home")) / "autotune"
    assert A.recommended_block(llama_pair, "org/target", "org/drafter") == 6
    default.write_text("{not json")
    assert A.recommended_block(llama_pair, "org/target", "org/drafter") is None


def test_folders_are_keyed_by_absolute_path_and_content(llama_pair, tmp_path, monkeypatch):
    import os

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"old weights")
    monkeypatch.chdir(tmp_path)
    key = A.profile_key(llama_pair, "m", "org/d")
    assert key["target"].split("#")[0] == str(folder.resolve()) and key["drafter"] == "org/d"
    assert A.profile_key(llama_pair, str(folder), "org/d") == key
    # Retrained into the same folder: another key, so a stale profile is not used.
    (folder / "model.safetensors").write_bytes(b"new weights!")
    os.utime(folder / "model.safetensors", ns=(1, 1))
    assert A.profile_key(llama_pair, "m", "org/d")["target"] != key["target"]


def test_profiles_stored_at_once_never_meet(tmp_path):
    """Two autotunes storing one key at the same moment (two `bench --autotune`, a server
    reading it meanwhile): each writes its own temporary file, so no save fails and a reader
    never sees a half-written profile (one shared temporary name lost a measurement to a
    'cannot store' error and showed readers an empty file)."""
    import threading

    key = {"device": "test", "target": "t", "drafter": "d"}
    profiles_of = [{"schema": profiles.SCHEMA, "key": key, "chosen_block": b} for b in (3, 5)]
    failures, seen = [], []

    def store(profile):
        for _ in range(150):
            try:
                profiles.save_profile(profile, tmp_path)
            except Exception as e:  # noqa: BLE001 - counted, asserted below
                failures.append(e)

    def read(writers):
        path = profiles.profile_path(key, tmp_path)
        while True:  # reads while they write, and once after
            done = not any(w.is_alive() for w in writers)
            if path.exists():
                try:
                    seen.append(json.loads(path.read_text())["chosen_block"])
                except Exception as e:  # noqa: BLE001 - a torn read: counted, asserted below
                    failures.append(e)
            if done:
                return

    writers = [threading.Thread(target=store, args=(p,)) for p in profiles_of]
    threads = [*writers, threading.Thread(target=read, args=(writers,), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == []
    assert seen and set(seen) <= {3, 5}
    assert [f.name for f in tmp_path.iterdir()] == [profiles.profile_path(key, tmp_path).name]


def test_a_shipped_datastore_left_off_gets_its_own_profile(llama_pair, tmp_path, monkeypatch):
    from dflash2_mlx.engine.datastore import DATASTORE_FILE

    drafter = tmp_path / "d"
    drafter.mkdir()
    plain = A.profile_key(llama_pair, "org/t", str(drafter))  # no datastore shipped
    (drafter / DATASTORE_FILE).write_bytes(b"x")
    off = A.profile_key(llama_pair, "org/t", str(drafter))  # shipped, but this pair has none
    monkeypatch.setattr(llama_pair.decoder, "datastore", object())  # shipped and on
    on = A.profile_key(llama_pair, "org/t", str(drafter))
    assert off["datastore"] == "off" and "datastore" not in on and "datastore" not in plain
    assert A.profile_path(off) != A.profile_path(on)


# ------------------------------------------------------------------------------ end to end
def test_bench_autotune_command_then_bench_uses_the_profile(tmp_path, capsys, steady_timings):
    t, d = save_pair(tmp_path / "pair")
    base = [
        "bench",
        "--target",
        str(t),
        "--drafter",
        str(d),
        "--limit",
        "2",
        "--max-tokens",
        "16",  # >= MIN_ROUNDS drafter rounds over the two prompts
        "--repeats",
        "1",
        "--context",
        "16",
    ]
    assert run(base + ["--autotune", "--block", "4", "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "◀ chosen" in out and "exp. tok/s" in out and "chosen block" in out
    assert "it replaces the profile" not in out  # the first one
    report = json.loads((tmp_path / "a.json").read_text())
    prof = report["autotune"]
    assert prof["max_block"] == 4 and 1 <= prof["chosen_block"] <= 4
    said = " ".join(out.split())  # the schedule by context is said, not only stored
    assert f"costs also timed at {prof['long_context']['context']:,} tokens" in said
    assert all(f"{b} from {c:,} tokens" in said for c, b in prof["block_by_context"])
    assert [r["block"] for r in prof["table"]] == [1, 2, 3, 4]
    assert set(prof["verify"]["ms"]) == {"1", "2", "3", "4"}
    assert len(prof["acceptance"]["position_probs"]) == 3
    unreached = [c == 0 for c in prof["acceptance"]["position_rounds"]]
    assert ("no round reached it" in said) == any(unreached)  # shown as —, not a measured 0
    assert Path(prof["path"]).is_file()
    pair = d2.load_pair(t, d)
    assert A.recommended_block(pair, str(t), str(d)) == prof["chosen_block"]
    assert prof["acceptance"]["lookup_block"] == max(
        A.LOOKUP_WIDTHS
    )  # lookup rounds, measured apart
    assert "lookup block:" in out and set(prof["lookup"]) >= {"table", "chosen", "reason"}
    assert run(base + ["--no-plot", "--json", str(tmp_path / "b.json")]) == 0
    settings = json.loads((tmp_path / "b.json").read_text())["settings"]
    assert settings["block_source"] == "autotune profile"
    assert settings["blocks"] == [prof["chosen_block"]]
    # a rerun replaces it, and says so (with what changed)
    assert run(base + ["--autotune", "--block", "4", "--json", str(tmp_path / "c.json")]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"it replaces the profile of {prof['created']}: " in said, said


def test_autotune_says_a_busy_machine_beside_the_profile_it_stored(
    tmp_path, capsys, monkeypatch, steady_timings
):
    """A review's two autotunes on a busy machine stored block 3, then block 4, from the same
    calibration, saying nothing: the choice rests on timings, so other work is said."""
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (9.8, 7.0, 5.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    t, d = save_pair(tmp_path / "pair")
    args = ["bench", "--target", str(t), "--drafter", str(d), "--limit", "2", "--block", "2"]
    args += ["--max-tokens", "16", "--repeats", "1", "--context", "16", "--autotune"]
    assert run([*args, "--json", str(tmp_path / "a.json")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "note: the machine was busy while this ran (load 9.8 on 2 cores" in err
    assert "the block it stored, may be off; rerun --autotune on a quiet machine" in err
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["machine_load"]["after"]["load_1m"] == 9.8


def test_autotune_refuses_implausible_verify_timings_and_stores_nothing(
    tmp_path, capsys, monkeypatch
):
    """Under a changing load, one token once timed 1,530 ms and three 220 ms: such costs
    would choose the block of every later chat."""
    from dflash2_mlx import costs

    real = costs.verify_costs

    def busy(*args, **kwargs):  # the first width's timing hit a busy spell
        out = real(*args, **kwargs)
        out["ms"][1] = 5 * max(out["ms"].values()) + 50.0
        return out

    monkeypatch.setattr(costs, "verify_costs", busy)
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (9.8, 7.0, 5.0))  # and the load says why
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    t, d = save_pair(tmp_path / "pair")
    args = ["bench", "--target", str(t), "--drafter", str(d), "--limit", "2", "--block", "2"]
    args += ["--max-tokens", "24", "--repeats", "1", "--context", "16", "--autotune", "--no-plot"]
    assert run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "the verify timings are not plausible: one token took" in err
    assert "nothing was stored: rerun it on a quiet machine" in err
    assert "note: the machine was busy while this ran (load 9.8 on 2 cores" in err
    assert A.recommended_block(d2.load_pair(t, d), str(t), str(d)) is None


def test_verify_timings_a_wider_width_beats_by_far_are_not_plausible():
    """A busy spell in the middle of the widths (a review's run: 5 tokens 1,098 ms, 6 tokens
    618 ms) is refused too; a BLAS curve's own bumps (width 3 dearer than 4) are not."""
    noisy = {1: 162.0, 3: 331.0, 4: 286.0, 5: 1098.0, 6: 618.0, 8: 1514.0}
    with pytest.raises(d2.ParameterError, match="5 tokens took 1098.0 ms, 6 tokens 618.0 ms"):
        costs.check_plausible(noisy)
    measured = {1: 130.7, 2: 139.7, 3: 168.2, 4: 137.0, 5: 173.9, 6: 175.1, 7: 216.2, 8: 177.4}
    costs.check_plausible(measured)  # the autotune table in docs/results (Intel Xeon)


def test_autotune_refuses_a_calibration_of_too_few_rounds_and_stores_nothing(
    tmp_path, capsys, steady_timings
):
    """One drafter round once chose block 1 and stored it: chat then drafted nothing."""
    t, d = save_pair(tmp_path / "pair")
    args = ["bench", "--target", str(t), "--drafter", str(d), "--limit", "1"]
    args += ["--max-tokens", "4", "--repeats", "1", "--context", "16", "--autotune", "--no-plot"]
    assert run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"fewer than the {A.MIN_ROUNDS} a block is chosen by; nothing was stored" in err
    assert "Traceback" not in err
    assert A.recommended_block(d2.load_pair(t, d), str(t), str(d)) is None
    assert run([*args, "--block", "1"]) == 0  # block 1 drafts nothing: no rounds to count
    assert A.recommended_block(d2.load_pair(t, d), str(t), str(d)) == 1


def test_autotune_refuses_before_measuring_where_no_profile_can_be_stored(
    tmp_path, capsys, monkeypatch
):
    """A cache folder that cannot be written lost minutes of measuring at the end."""
    t, d = save_pair(tmp_path / "pair")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DFLASH2_HOME", str(blocker / "home"))
    measured = []
    monkeypatch.setattr(A, "calibrate", lambda *a, **k: measured.append(1))
    args = ["bench", "--target", str(t), "--drafter", str(d), "--limit", "1", "--autotune"]
    assert run([*args, "--no-plot"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{blocker / 'home' / 'autotune'}: cannot store the autotune profile there" in err
    assert "set DFLASH2_HOME to a writable folder" in err and "Traceback" not in err
    assert not measured


def test_chat_uses_the_stored_profile_unless_block_is_given(
    tmp_path, capsys, monkeypatch, steady_timings
):
    t, d = save_pair(tmp_path / "pair")
    pair = d2.load_pair(t, d)
    _fake_measurements(monkeypatch, best_block=6)
    A.save_profile(A.autotune(pair, [], target=str(t), drafter=str(d)))
    chat = [
        "chat",
        "--target",
        str(t),
        "--drafter",
        str(d),
        "--prompt",
        "hello",
        "--max-tokens",
        "4",
    ]
    assert run(chat) == 0
    assert "block 6" in capsys.readouterr().err
    assert run(chat + ["--block", "3"]) == 0
    assert "block 3" in capsys.readouterr().err
    path = A.profile_path(A.profile_key(pair, str(t), str(d)))
    good = json.loads(path.read_text())
    # a field that does not read is left out and said to be; the others still apply
    for bad in ("4", None):  # blamed on the block, not on the blocks by context that fall from it
        path.write_text(json.dumps({**good, "chosen_block": bad, "block_by_context": [[64, 2]]}))
        assert run(chat) == 0
        err = " ".join(capsys.readouterr().err.split())
        assert f"{path}: the profile's chosen_block (missing or unreadable) ignored" in err, err
    # another device's or pair's profile at this path: said, not silently passed over
    path.write_text(json.dumps({**good, "key": {**good["key"], "device": "elsewhere"}}))
    assert run(chat) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path}: the profile of another device or pair, ignored" in err, err
    # a damaged profile is ignored and said to be, naming the file
    path.write_text(json.dumps(good)[:100])
    assert run(chat) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"{path}: the autotune profile is unreadable" in err and "block 6" not in err
