"""`dflash2 bench` and dflash2_mlx.bench on a tiny real pair: the JSON structure, the per-prompt
greedy equality check (and that a mismatch is reported loudly, exit 1), the PNG, the kernel
table, one-line user errors, and the help example."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest

import dflash2_mlx as d2
from dflash2_cli.app import run
from dflash2_mlx import bench, costs
from dflash2_mlx.prompts import load_prompts

PNG = b"\x89PNG\r\n\x1a\n"
pytestmark = pytest.mark.usefixtures("dflash2_home")  # autotune profiles go there


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return d2.load_pair(*tiny_pair)


def _args(dirs, tmp_path, *extra) -> list[str]:
    return [
        "bench",
        "--target",
        str(dirs[0]),
        "--drafter",
        str(dirs[1]),
        "--max-tokens",
        "8",
        "--repeats",
        "1",
        "--json",
        str(tmp_path / "r.json"),
        *extra,
    ]


# ------------------------------------------------------------------------------ pure helpers
def test_first_mismatch():
    assert bench.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert bench.first_mismatch([1, 2], [1, 2, 3]) == 2


def test_select_prompts_round_robin_over_categories():
    prompts = load_prompts("heldout")
    cats = {p.category for p in prompts}
    chosen = bench.select_prompts(prompts, len(cats))
    assert {p.category for p in chosen} == cats  # one per category
    assert bench.select_prompts(prompts, None) == prompts
    assert len(bench.select_prompts(prompts, 3)) == 3


# ------------------------------------------------------------------------------ library
def test_run_bench_structure_and_equality(pair):
    prompts = bench.select_prompts(load_prompts("heldout"), 3)
    out = bench.run_bench(pair, prompts, [2, 4], max_tokens=10, repeats=2)
    assert out["all_identical"] and out["mismatches"] == []
    assert [r["block"] for r in out["results"]] == [2, 4]
    for res in out["results"]:
        assert len(res["rows"]) == 3
        assert set(res["per_category"]) == {p.category for p in prompts}
        for key in (
            "prompts",
            "identical",
            "plain_tps",
            "dflash2_tps",
            "speedup",
            "tau",
            "draft_ms_per_round",
            "verify_ms_per_round",
            "speedup_total",
        ):
            assert key in res["summary"], key
        for row in res["rows"]:
            assert row["identical"] and row["first_mismatch"] is None
            assert row["tokens"] == 10 and row["plain_tps"] > 0 and row["dflash2_tps"] > 0
            assert 1.0 <= row["tau"] <= res["block"]


def test_run_bench_reports_a_mismatch(pair, monkeypatch):
    real = bench.plain_decode

    def corrupted(p, ids, max_tokens):
        t = real(p, ids, max_tokens)
        t.tokens[3] = (t.tokens[3] + 1) % 90
        return t

    monkeypatch.setattr(bench, "plain_decode", corrupted)
    prompts = load_prompts("heldout")[:1]
    out = bench.run_bench(pair, prompts, [4], max_tokens=8, repeats=1, warmup=False)
    assert not out["all_identical"]
    (m,) = out["mismatches"]
    assert m["index"] == 3 and m["block"] == 4 and m["id"] == prompts[0].id
    assert out["results"][0]["rows"][0]["first_mismatch"] == 3


def test_run_concurrency_structure_and_equality(pair):
    from dflash2_mlx import bench_batch

    prompts = bench.select_prompts(load_prompts("heldout"), 4)
    out = bench_batch.run_concurrency(pair, prompts, [3, 1, 2], max_tokens=10, repeats=2)
    assert out["all_identical"] and out["mismatches"] == []
    assert out["levels"] == [1, 2, 3] and out["batched_engine"] and out["fallback"] is None
    assert len(out["prompt_tokens"]) == 4 and min(out["prompt_tokens"]) > 0
    seq = out["sequential"]
    assert seq["vs_sequential"] == 1.0 and seq["mean_rows_per_round"] == 1.0
    assert len(seq["wall_s"]) == 2 and seq["aggregate_tps"] > 0
    assert seq["tokens"] == 40  # 4 prompts x 10 tokens (the tiny target never emits EOS)
    for res, n in zip(out["results"], [1, 2, 3]):
        assert res["concurrency"] == n and res["prompts"] == res["identical"] == 4
        assert res["tokens"] == seq["tokens"] and len(res["wall_s"]) == 2
        assert res["aggregate_tps"] > 0 and res["vs_sequential"] > 0
        # Every row's event is one row of a round; more than one row only when n allows it.
        assert 1.0 <= res["mean_rows_per_round"] <= n
        assert (res["mean_rows_per_round"] > 1.0) == (n > 1)


def test_run_concurrency_reports_a_mismatch(pair, monkeypatch):
    from dflash2_mlx import bench_batch

    real = bench_batch.run_batched

    def corrupted(p, prompts, params, max_batch, width_cost=None):
        run = real(p, prompts, params, max_batch, width_cost)
        if max_batch == 2:
            run.outputs[1][4] = (run.outputs[1][4] + 1) % 90
        return run

    monkeypatch.setattr(bench_batch, "run_batched", corrupted)
    prompts = load_prompts("heldout")[:2]
    out = bench_batch.run_concurrency(pair, prompts, [1, 2], max_tokens=8, repeats=1, warmup=False)
    assert not out["all_identical"]
    (m,) = out["mismatches"]
    assert m["concurrency"] == 2 and m["id"] == prompts[1].id and m["index"] == 4
    assert [r["identical"] for r in out["results"]] == [2, 1]


def test_cost_curves(pair):
    vc = costs.verify_costs(pair, [1, 2, 4], context=32, repeats=2)
    assert set(vc["ms"]) == {1, 2, 4} and vc["ratio"][1] == 1.0
    assert all(v > 0 for v in vc["ms"].values())
    dc = costs.draft_costs(pair, [1, 2, 4], context=32, repeats=2)
    assert dc["ms"][1] == 0.0 and dc["ms"][2] > 0 and dc["ms"][4] > 0


# ------------------------------------------------------------------------------ the command
def test_bench_command_json_and_png(tiny_pair, tmp_path, capsys):
    assert run(_args(tiny_pair, tmp_path, "--limit", "2", "--block", "2,4", "--context", "32")) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "all outputs identical" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "dflash2.bench/1"
    env = report["environment"]
    for key in ("mlx", "device", "blas", "blas_threads", "chip"):
        assert key in env
    assert report["pair"]["trained_block"] == 8 and report["pair"]["drafter_version"] == 2
    assert (
        report["settings"]["blocks"] == [2, 4] and report["settings"]["block_source"] == "--block"
    )
    assert report["all_identical"] is True
    if hasattr(os, "getloadavg"):
        assert report["machine_load"]["after"]["cores"] == os.cpu_count()
    assert set(report["verify_cost"]["ratio"]) == {"1", "2", "4"}
    assert [r["block"] for r in report["results"]] == [2, 4]
    assert report["results"][1]["summary"]["verify_cost_ratio"] > 0
    for row in report["results"][0]["rows"]:  # no rounds of a source: no τ (as the summary)
        for src in ("lookup", "datastore"):
            tau_ = row[f"{src}_tau"]
            assert (tau_ is None) if row[f"{src}_rounds"] == 0 else tau_ >= 1.0
    png = Path(report["plot"])
    assert png == tmp_path / "r.png" and png.read_bytes()[:8] == PNG


def test_bench_command_mismatch_is_loud(tiny_pair, tmp_path, capsys, monkeypatch):
    real = bench.plain_decode

    def corrupted(p, ids, max_tokens):
        t = real(p, ids, max_tokens)
        t.tokens[-1] = (t.tokens[-1] + 1) % 90
        return t

    monkeypatch.setattr(bench, "plain_decode", corrupted)
    assert run(_args(tiny_pair, tmp_path, "--limit", "1", "--block", "4", "--no-plot")) == 1
    err = capsys.readouterr().err
    assert "MISMATCH block 4" in err and "LOSSLESSNESS VIOLATED" in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["all_identical"] is False and report["mismatches"][0]["index"] == 7
    assert report["mismatches"][0]["near_tie"] is False  # a corrupted token is no tie
    # where the two tokens' logits lie within the dtype's rounding (bf16 on a GPU: a verify's
    # and a one-token forward's kernels round apart), it is said so, not called a violation
    near = {"gap": 0.06, "tolerance": 0.5, "near_tie": True}
    monkeypatch.setattr(bench, "parting", lambda *a: near)
    assert run(_args(tiny_pair, tmp_path, "--limit", "1", "--block", "4", "--no-plot")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "near-tie block 4" in err and "LOSSLESSNESS VIOLATED" not in err
    assert "not a lossless violation" in err
    # a tie in one repeat never hides a real parting in another (only the first was kept)
    said = iter([near, {"gap": 3.0, "tolerance": 0.5, "near_tie": False}])
    monkeypatch.setattr(bench, "parting", lambda *a: next(said))
    argv = _args(tiny_pair, tmp_path, "--limit", "1", "--block", "4", "--no-plot")
    assert run([*argv, "--repeats", "2"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "near-tie block 4" in err and "MISMATCH block 4" in err


def test_a_parting_is_a_near_tie_only_within_the_dtypes_rounding():
    import mlx.core as mx
    import tiny

    from dflash2_mlx.divergence import FLOOR, divergence, rounding

    assert rounding(20.0, mx.bfloat16) == 4 * 2.0 ** (4 - 7)  # 4 units in the last place
    assert rounding(20.0, mx.float32) == FLOOR and rounding(0.1, mx.float16) == 4 * 2.0**-10
    model = tiny.make_target("llama")
    logits = model(mx.array([[3, 1, 4]]))[0, -1]
    first, second = mx.argsort(-logits)[:2].tolist()
    apart = divergence(model, [3, 1], [4], first, second)
    assert apart["gap"] == pytest.approx(float(logits[first] - logits[second]), abs=1e-5)
    assert apart["near_tie"] == (apart["gap"] <= FLOOR)
    assert divergence(model, [3, 1], [4], first, first)["near_tie"]


def test_bench_concurrency_command_json(tiny_pair, tmp_path, capsys):
    argv = _args(tiny_pair, tmp_path, "--limit", "3", "--concurrency", "2,1", "--block", "4")
    assert run(argv) == 0
    out = capsys.readouterr().out
    assert "aggregate tok/s" in out and "identical to the sequential" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["schema"] == "dflash2.bench/1"
    for key in ("mlx", "device", "blas", "blas_threads", "chip"):
        assert key in report["environment"]
    settings = report["settings"]
    assert settings["concurrency"] == [1, 2] and settings["blocks"] == [4]
    assert settings["block_source"] == "--block" and len(settings["prompt_ids"]) == 3
    conc = report["concurrency"]
    assert conc["all_identical"] is True and conc["levels"] == [1, 2]
    assert [r["concurrency"] for r in conc["results"]] == [1, 2]
    assert all(r["identical"] == 3 and r["vs_sequential"] > 0 for r in conc["results"])
    assert "results" not in report and "verify_cost" not in report  # the speed mode did not run


def test_a_busy_machine_is_said_after_a_concurrency_run(tiny_pair, tmp_path, capsys, monkeypatch):
    """--concurrency times throughput as the speed run does: its report keeps the load, and
    other work beside it is said."""
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (9.8, 7.0, 5.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    argv = _args(tiny_pair, tmp_path, "--limit", "2", "--concurrency", "2", "--block", "4")
    assert run(argv) == 0
    err = capsys.readouterr().err
    note = next(line for line in err.splitlines() if line.startswith("note: the machine was busy"))
    assert "(load 9.8 on 2 cores" in note and note.rstrip().endswith("do not depend on it)")
    assert "the aggregate tok/s and their ratios may be off" in note  # one line, its own words
    loads = json.loads((tmp_path / "r.json").read_text())["machine_load"]
    assert loads["before"]["load_1m"] == 9.8 and "own_cores" in loads["after"]


def test_a_prompt_longer_than_the_context_is_refused_before_any_timing(tiny_pair, tmp_path, capsys):
    """A prompt that with --max-tokens outruns the model's context would run past what the
    model was trained on, slowly, measuring nothing: one line names it, before any timing."""
    prompts = tmp_path / "p.jsonl"
    long_text = " ".join(["word"] * 5000)  # the tiny model's context is 4,096
    rows = [
        {"id": "short", "category": "chat", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "long-1", "category": "chat", "messages": [{"role": "user", "content": long_text}]},
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert run(_args(tiny_pair, tmp_path, "--prompts", str(prompts))) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "prompt 'long-1':" in err and "exceed the model's context (4,096 tokens)" in err
    assert not (tmp_path / "r.json").exists()


def test_bench_concurrency_mismatch_is_loud(tiny_pair, tmp_path, capsys, monkeypatch):
    from dflash2_mlx import bench_batch

    real = bench_batch.run_batched

    def corrupted(p, prompts, params, max_batch, width_cost=None):
        run = real(p, prompts, params, max_batch, width_cost)
        run.outputs[0][-1] = (run.outputs[0][-1] + 1) % 90
        return run

    monkeypatch.setattr(bench_batch, "run_batched", corrupted)
    assert run(_args(tiny_pair, tmp_path, "--limit", "1", "--concurrency", "2")) == 1
    err = capsys.readouterr().err
    assert "MISMATCH concurrency 2" in err and "LOSSLESSNESS VIOLATED" in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["concurrency"]["all_identical"] is False
    assert report["concurrency"]["mismatches"][0]["index"] == 7
    assert report["concurrency"]["mismatches"][0]["near_tie"] is False
    near = {"gap": 0.06, "tolerance": 0.5, "near_tie": True}  # a batched matmul's rounding
    monkeypatch.setattr(bench_batch, "parting", lambda *a: near)
    assert run(_args(tiny_pair, tmp_path, "--limit", "1", "--concurrency", "2")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "near-tie concurrency 2" in err and "LOSSLESSNESS VIOLATED" not in err
    said = iter([near, {"gap": 3.0, "tolerance": 0.5, "near_tie": False}])  # a tie hides none
    monkeypatch.setattr(bench_batch, "parting", lambda *a: next(said))
    argv = _args(tiny_pair, tmp_path, "--limit", "1", "--concurrency", "2")
    assert run([*argv, "--repeats", "2"]) == 1
    assert "MISMATCH concurrency 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--kernels", "--prompts", "/nope.jsonl"], "--prompts needs a model run"),
        (["--kernels", "--block", "4"], "--block needs a model run"),
        (["--kernels", "--no-thinking"], "--thinking/--no-thinking needs a model run"),
        (["--kernels", "--lookup", "0"], "--lookup needs a model run"),
        (["--concurrency", "1,2", "--context", "512"], "--concurrency does not use it"),
    ],
)
def test_bench_refuses_flags_its_mode_would_ignore(args, needle, capsys, monkeypatch):
    monkeypatch.setattr(d2, "load_pair", lambda *a, **k: pytest.fail("loaded a model"))
    assert run(["bench", *args]) == 2
    assert needle in capsys.readouterr().err


def test_bench_kernels_alone_loads_no_model(tmp_path, capsys, monkeypatch):
    import dflash2_mlx.kernels as K

    fake = {
        "metal": False,
        "kernels_run": False,
        "setting": "auto",
        "note": "reference only",
        "repeats": 20,
        "device": "cpu",
        "results": [
            {
                "op": "pair_scores",
                "case": "tiny",
                "reference_ms": 0.5,
                "kernel_ms": None,
                "speedup": None,
                "max_abs_diff": None,
            }
        ],
    }
    asked = []
    monkeypatch.setattr(K, "bench_kernels", lambda repeats=20: asked.append(repeats) or fake)
    monkeypatch.setattr(d2, "load_pair", lambda *a, **k: pytest.fail("loaded a model"))
    assert run(["bench", "--kernels", "--json", str(tmp_path / "k.json")]) == 0
    assert run(["bench", "--kernels", "--repeats", "3", "--json", str(tmp_path / "k.json")]) == 0
    assert asked == [20, 3]  # 20 unless --repeats says
    cap = capsys.readouterr()
    assert "pair_scores" in cap.out and "not run" in cap.out
    assert "not run on this machine" in cap.err
    report = json.loads((tmp_path / "k.json").read_text())
    assert report["kernels"]["kernels_run"] is False and "results" not in report


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--block", "0"], "--block must be >= 1"),
        (["--block", "x"], "--block takes comma-separated integers (e.g. --block 4,8,16)"),
        (["--autotune", "--block", "2,4"], "--autotune takes one --block"),
        (["--limit", "0"], "--limit must be >= 1"),
        (["--max-tokens", "1"], "--max-tokens must be >= 2"),
        (["--plot", "a.png", "--no-plot"], "contradict"),
        (["--prompts", "/nonexistent.jsonl"], "cannot read prompt file"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--concurrency", "2,x"], "--concurrency takes comma-separated integers"),
        (["--block", "4 8,,16", "--block", ","], "--block takes comma-separated integers"),
        (["--concurrency", "2", "--autotune"], "separate modes"),
        (["--concurrency", "2", "--block", "2,4"], "--concurrency takes one --block"),
        (["--concurrency", "2", "--plot", "a.png"], "--concurrency writes no plot"),
        # one file for both: the JSON would replace the plot (or the plot the JSON)
        (["--json", "out.png"], "--json out.png: the plot would be written over it"),
        (["--json", "o.json", "--plot", "o.json"], "--json o.json: the plot would be written"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys):
    assert run(["bench", "--target", "/nonexistent-t", "--drafter", "/nonexistent-d", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_block_above_trained_is_a_user_error(tiny_pair, tmp_path, capsys):
    assert run(_args(tiny_pair, tmp_path, "--block", "9", "--limit", "1")) == 2
    assert "exceeds the drafter's trained block size 8" in capsys.readouterr().err


def test_help_has_an_example(capsys):
    assert run(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "Example: dflash2 bench" in out and "--autotune" in out and "--kernels" in out
    assert "--concurrency" in out


def test_cost_curves_on_a_hybrid_gated_deltanet_target():
    from tiny import make_drafter, make_target

    hybrid = d2.Pair.from_models(make_target("qwen3_5"), None, make_drafter(2, block_size=8))
    vc = costs.verify_costs(hybrid, [1, 4], context=24, repeats=2)
    dc = costs.draft_costs(hybrid, [1, 4], context=24, repeats=2)
    assert vc["ms"][4] > 0 and dc["ms"][4] > 0


def test_the_plain_baseline_is_the_argmax_of_half_precision_logits():
    """mlx-lm's greedy sampler reads logits - logsumexp in the model's dtype: in bf16 the top
    two can round to one value and the lower id wins, and bench called dflash2's true argmax
    a mismatch."""
    import mlx.core as mx

    from dflash2_mlx.bench import plain_decode

    top = mx.array([0.0116577, 0.0117188], dtype=mx.bfloat16)
    row = mx.concatenate([top, mx.full((30,), 0.011, dtype=mx.bfloat16)])
    assert int(mx.argmax(row - mx.logsumexp(row, keepdims=True))) == 0  # the tie, in bf16

    class Fixed:  # every step scores the vocabulary the same way
        layers = ()

        def make_cache(self):
            return []

        def __call__(self, inputs, cache=None, **kw):
            return mx.broadcast_to(row, (1, inputs.shape[-1], row.shape[0]))

    pair = types.SimpleNamespace(model=Fixed(), eos_ids=frozenset())
    assert plain_decode(pair, [3, 4], 3).tokens == [1, 1, 1]


def test_a_busy_machine_is_said_beside_the_speeds(monkeypatch):
    """Timings taken while the machine runs more than it has cores swing by half prompt by
    prompt (a helper measured 0.30x and 1.01x for one prompt): bench says so, and the JSON
    keeps the load before and after. The run's own threads are not other work: on 2 cores
    dflash2's decoding alone (two kernel threads and MLX's) keeps the load above 2."""
    import os
    import time

    from dflash2_mlx import bench_env as E

    monkeypatch.setattr(os, "getloadavg", lambda: (9.8, 7.0, 5.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    busy = E.machine_load()
    assert busy == {"load_1m": 9.8, "cores": 2}
    assert "load 9.8 on 2 cores" in E.busy_note(busy)
    assert E.busy_note({"load_1m": 1.9, "cores": 2}) is None and E.busy_note(None) is None
    # a bench alone on 2 cores (measured): quiet; 1.5 cores of other work beside it: busy
    assert E.busy_note({"load_1m": 2.21, "cores": 2, "own_cores": 1.67}) is None
    note = E.busy_note({"load_1m": 3.2, "cores": 2, "own_cores": 1.7})
    assert "load 3.2 on 2 cores, 1.7 of it this run's" in note
    # own_cores: this process's CPU seconds over the wall seconds since the clock
    clock = (time.perf_counter() - 2.0, time.process_time() - 3.0)
    assert 1.4 <= E.machine_load(clock)["own_cores"] <= 1.6


def test_bench_says_it_measures_greedy_a_model_that_samples_by_default(
    tmp_path, capsys, dflash2_home
):
    """bench decodes greedily; a model whose generation_config.json samples (Qwen3's T 0.6,
    top_k 20, top_p 0.95) is run by chat and serve at those settings, so bench says so."""
    from tiny_pair import save_pair

    t, d = save_pair(tmp_path / "pair")
    args = ["bench", "--target", str(t), "--drafter", str(d), "--limit", "1"]
    args += ["--max-tokens", "4", "--repeats", "1", "--no-plot"]
    assert run(args) == 0
    assert "measured greedy" not in capsys.readouterr().err
    config = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    (t / "generation_config.json").write_text(json.dumps(config))
    assert run(args) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "note: measured greedy; the model samples by default (temperature 0.6" in err
    (t / "generation_config.json").write_text(json.dumps({"top_k": "twenty"}))
    assert run(args) == 0  # bench samples nothing: a file chat and serve refuse stops it not
    assert "measured greedy" not in capsys.readouterr().err


_FULL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from dflash2_cli.bench_run import _write_json
from dflash2_mlx.errors import ConfigError
from dflash2_mlx.profiles import save_profile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    save_profile({"key": {"a": 1}, "rows": "y" * 100000}, sys.argv[2])
except ConfigError as e:
    print("profile:", e)
_write_json({"rows": "x" * 100000}, Path(sys.argv[1]))
"""


def test_a_report_or_profile_that_cannot_be_written_whole_leaves_the_old_one(tmp_path):
    """A full disk (here a file-size limit: the same failed write) cut a `bench --json` report
    short, and the report that was there was gone; now the new one is written whole or the old
    one stays, and no temporary file is left."""
    import subprocess
    import sys

    from dflash2_mlx.profiles import profile_path

    out = tmp_path / "out"
    report = out / "report.json"
    report.parent.mkdir()
    report.write_text('{"old": true}\n')
    profile = profile_path({"a": 1}, out / "profiles")
    profile.parent.mkdir()
    profile.write_text('{"old": true}\n')
    run = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(report), str(profile.parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert f"cannot write {report}" in run.stderr, run.stderr
    assert "cannot store the autotune profile" in run.stdout, run.stdout
    assert json.loads(report.read_text()) == {"old": True}
    assert json.loads(profile.read_text()) == {"old": True}
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == sorted(
        ["report.json", profile.name]
    )


def test_a_report_written_through_a_link_keeps_the_link_and_the_files_mode(tmp_path):
    """A report path that is a symlink was replaced by a plain file (its target kept the old
    report), and a 0600 report came out 0644."""
    from dflash2_mlx.paths import write_whole

    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    real.chmod(0o600)
    link.symlink_to(real)
    write_whole(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]


def test_a_report_to_dev_stdout_redirected_to_a_file_is_written_into_it(tmp_path):
    """`--json /dev/stdout >> out.txt`: /dev/stdout leads to out.txt itself, and a new file
    renamed over it lost what it held (and what was printed after went to a deleted file)."""
    import subprocess
    import sys

    out = tmp_path / "out.txt"
    out.write_text("earlier\n")
    code = (
        "import sys; from dflash2_mlx.paths import write_whole\n"
        "print('before', flush=True); write_whole('/dev/stdout', 'report\\n'); print('after')\n"
    )
    with open(out, "a") as fh:
        subprocess.run([sys.executable, "-c", code], stdout=fh, check=True, timeout=60)
    assert out.read_text() == "earlier\nbefore\nreport\nafter\n"


def test_the_header_says_how_the_blas_runs():
    """The BLAS line of a bench's header: OpenBLAS's threads, the shim's kernel and its
    threads, and whether larger products run in chunks over them (what the timings depend on)."""
    from dflash2_cli.bench_view import env_line

    env = {"device": "cpu", "chip": "AMD EPYC", "mlx": "0.32.4", "mlx_lm": "0.32.2"}
    env |= {"platform": "Linux x86_64", "blas": "scipy-openblas", "blas_threads": 1}
    kernel = env | {"blas_kernel": "avx512", "blas_kernel_threads": 2}
    assert "BLAS scipy-openblas x1 · " in env_line(env)
    assert "x1 + avx512 kernel x2 · " in env_line(kernel)
    split = env_line(kernel | {"blas_split": True})
    assert "x1 + avx512 kernel x2 (larger products chunked over its threads) · " in split
