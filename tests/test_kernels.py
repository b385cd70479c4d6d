"""Custom Metal kernels (metal/*.metal) against the pure-MLX references, on the CPU harness and
on Metal (the executors: kernel_exec.py), and the dispatch between kernels and references (the
walks' cases: test_kernel_walks.py)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from harness import signature
from kernel_exec import f32, lattice, require_metal

import dflash2_mlx
from dflash2_mlx import kernels
from dflash2_mlx.kernels import _references as conv_ref
from dflash2_mlx.kernels import _references as sel_ref
from dflash2_mlx.drafter.conv import GroupedDynamicConv
from dflash2_mlx.drafter.selector import CandidateSelector
from dflash2_mlx.kernels import _references as _reference
from dflash2_mlx.kernels import _checks, _dispatch, _launch, _settings

EPS = {mx.float32: 2.0**-23, mx.float16: 2.0**-10, mx.bfloat16: 2.0**-7}


# ----------------------------------------------------------------------------- dynamic conv
CONV_SHAPES = [
    # (lead, L, H, group)
    ((), 1, 32, 16),  # block length 1: tap 1 reads only zero padding
    ((), 2, 32, 16),  # block length 2: row 1 reads the anchor row
    ((1,), 16, 64, 16),
    ((2, 3), 5, 48, 16),  # several blocks: taps never cross a block start
    ((), 1, 16, 16),  # one group: `dynamic` has 2 elements (constant address space)
    ((3,), 7, 40, 8),
]


def _conv_inputs(lead, length, hidden, group, dtype, seed, scale=1.0):
    k = mx.random.split(mx.random.key(seed), 3)
    x = (scale * mx.random.normal((*lead, length, hidden), key=k[0])).astype(dtype)
    dyn = (0.5 * mx.random.normal((*lead, length, 2, hidden // group), key=k[1])).astype(dtype)
    base = mx.random.normal((2, hidden), key=k[2])
    return x, dyn, base


def _check_conv(got, x, dyn, base, group):
    dtype = x.dtype
    assert got.dtype == dtype and got.shape == x.shape
    got = f32(got)
    # Same math in fp32 (base rounded to the dtype first, as the launch does), rounded once.
    b = base.astype(dtype).astype(mx.float32)
    exact = conv_ref.dynamic_conv(x.astype(mx.float32), dyn.astype(mx.float32), b, group)
    mag = f32(
        conv_ref.dynamic_conv(
            mx.abs(x.astype(mx.float32)), mx.abs(dyn.astype(mx.float32)), mx.abs(b), group
        )
    )
    want = f32(exact.astype(dtype))
    # <= 1 ulp of the dtype from the fp32 result rounded once (plus fp32 noise on cancellation).
    assert np.all(np.abs(got - want) <= EPS[dtype] * np.abs(want) + 4 * 2.0**-23 * mag), np.max(
        np.abs(got - want)
    )
    # And close to the reference computed in the dtype itself (several roundings there).
    ref = f32(conv_ref.dynamic_conv(x, dyn, base, group))
    assert np.all(np.abs(got - ref) <= 4 * EPS[dtype] * mag + 1e-30)


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_dynamic_conv_matches_reference(run_kernel, dtype):
    for i, (lead, length, hidden, group) in enumerate(CONV_SHAPES):
        x, dyn, base = _conv_inputs(lead, length, hidden, group, dtype, seed=i)
        launch = _launch.conv_launch(x, dyn, base, group)
        assert launch is not None
        _check_conv(run_kernel(launch)[0], x, dyn, base, group)
    if dtype != mx.float16:  # large activations (fp16 would overflow near 6.5e4)
        x, dyn, base = _conv_inputs((2,), 4, 32, 16, dtype, seed=99, scale=1e4)
        _check_conv(run_kernel(_launch.conv_launch(x, dyn, base, 16))[0], x, dyn, base, 16)


def test_dynamic_conv_taps_never_cross_a_block_start(run_kernel):
    x, dyn, base = _conv_inputs((2,), 4, 32, 16, mx.float32, seed=5)
    y0 = np.array(run_kernel(_launch.conv_launch(x, dyn, base, 16))[0])
    # Perturb block 0's rows >= 2: block 0 rows < 2 and all of block 1 stay bit-identical.
    x2 = x.at[0, 2:].add(7.0)
    y1 = np.array(run_kernel(_launch.conv_launch(x2, dyn, base, 16))[0])
    np.testing.assert_array_equal(y0[0, :2], y1[0, :2])
    np.testing.assert_array_equal(y0[1], y1[1])
    assert not np.array_equal(y0[0, 2:], y1[0, 2:])


# ----------------------------------------------------------------------------- pair scores
PAIR_CASES = [
    # (lead, P, K, rank, dtypes of (unary, hidden, pred, succ), unary scale)
    ((15,), 16, 16, 256, (mx.float32,) * 4, 1.0),  # the shipped sizes
    ((3,), 5, 5, 37, (mx.float32,) * 4, 1.0),  # K < 16, rank not a multiple of 32
    ((1,), 1, 16, 100, (mx.float32,) * 4, 1.0),  # one drafted row, one predecessor (anchor)
    ((2, 4), 16, 16, 64, (mx.float32, mx.bfloat16, mx.bfloat16, mx.bfloat16), 1.0),
    ((6,), 16, 16, 96, (mx.float16,) * 4, 1.0),
    ((4,), 16, 16, 256, (mx.bfloat16, mx.float32, mx.bfloat16, mx.float16), 1.0),
    ((5,), 16, 16, 33, (mx.float32,) * 4, 1e4),  # large logits ~1e4
]


def _pair_inputs(lead, preds, k, rank, dtypes, scale, seed):
    ks = mx.random.split(mx.random.key(seed), 4)
    unary = (scale * mx.random.normal((*lead, k), key=ks[0])).astype(dtypes[0])
    hidden = mx.random.normal((*lead, rank), key=ks[1]).astype(dtypes[1])
    pred = (0.3 * mx.random.normal((*lead, preds, rank), key=ks[2])).astype(dtypes[2])
    succ = (0.3 * mx.random.normal((*lead, k, rank), key=ks[3])).astype(dtypes[3])
    return unary, hidden, pred, succ


def test_pair_scores_match_reference(run_kernel):
    for i, case in enumerate(PAIR_CASES):
        args = _pair_inputs(*case, seed=10 + i)
        launch = _launch.pair_scores_launch(*args)
        assert launch is not None
        got = run_kernel(launch)[0]
        ref = sel_ref.pair_scores(*args)
        assert got.dtype == mx.float32 and got.shape == ref.shape
        scale = sel_ref.pair_scores(*(mx.abs(a.astype(mx.float32)) for a in args))
        err = np.abs(np.array(got) - np.array(ref))
        assert np.all(err <= 1e-5 * np.array(scale) + 1e-6), (case, err.max())


def test_reference_argmax_only_differs_from_mx_argmax_on_nan():
    """Pure MLX: the reference's argmax is mx.argmax wherever there is no NaN."""
    x = mx.random.normal((50, 9), key=mx.random.key(3))
    x = mx.concatenate([x, mx.zeros((2, 9)), mx.full((1, 9), -float("inf"))])
    assert sel_ref.argmax_skipping_nan(x).tolist() == mx.argmax(x, axis=-1).tolist()
    rows = mx.array([[float("nan"), 1.0, 3.0], [2.0, float("nan"), float("nan")]])
    assert sel_ref.argmax_skipping_nan(rows).tolist() == [2, 0]


def test_metal_launches_bind_to_mlx_metal_kernel():
    """Without Metal, MLX still checks the call's arguments before refusing to run."""
    if kernels.metal_available():
        pytest.skip("Metal available: the real kernels run in the [metal] tests")
    x, dyn, base = _conv_inputs((1,), 3, 32, 16, mx.bfloat16, seed=3)
    launches = [
        _launch.conv_launch(x, dyn, base, 16),
        _launch.pair_scores_launch(*_pair_inputs((3,), 4, 4, 8, (mx.float32,) * 4, 1, 0)),
        _launch.walk_launch(lattice((), 3, 4, 0), 0.0),
        _launch.walk_launch(lattice((), 3, 4, 0), 1.0, mx.full((3, 4), 0.5)),
        _launch.expected_walk_launch(lattice((), 3, 4, 0), 1.0),
    ]
    for launch in launches:
        with pytest.raises(RuntimeError, match="No Metal back-end"):
            mx.eval(_dispatch.execute(launch))


# ----------------------------------------------------------------------------- dispatch
def test_setting_resolution():
    r = _settings.resolve
    assert r(None).mode is kernels.KernelMode.AUTO and not r(None).note
    assert r("off").mode is r("0").mode is r("Reference").mode is kernels.KernelMode.OFF
    assert r("ON").mode is r("1").mode is kernels.KernelMode.ON
    bad = r("sometimes")
    assert bad.mode is kernels.KernelMode.AUTO and "sometimes" in bad.note
    off = _dispatch.status(r("off"))
    assert off["path"] == "reference" and "DFLASH2_KERNELS=off" in off["reason"]
    assert not _dispatch.kernels_active(r("off"))
    assert _dispatch.describe(r("off")).startswith("reference (forced by DFLASH2_KERNELS=off")


def test_setting_is_read_once_at_import():
    probe = (
        "import dflash2_mlx.kernels as k, json; "
        "print(json.dumps([k.SETTING.mode.value, k.status()['path']]))"
    )
    env = dict(os.environ, DFLASH2_KERNELS="off")
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == '["off", "reference"]'


def test_doctor_reports_the_kernel_path():
    line = dflash2_mlx.doctor()["kernels"]
    assert line == kernels.describe()
    assert line.startswith("metal" if kernels.kernels_active() else "reference")


def test_unsupported_shapes_and_dtypes_have_no_launch():
    x = mx.zeros((4, 32))
    assert _launch.conv_launch(x, mx.zeros((4, 3, 2)), mx.zeros((3, 32)), 16) is None  # 3 taps
    assert _launch.conv_launch(x, mx.zeros((4, 2, 2), mx.float16), mx.zeros((2, 32)), 16) is None
    assert _launch.conv_launch(x, mx.zeros((4, 2, 3)), mx.zeros((2, 32)), 12) is None  # 32 % 12
    assert (
        _launch.conv_launch(
            x.astype(mx.int32), mx.zeros((4, 2, 2), mx.int32), mx.zeros((2, 32)), 16
        )
        is None
    )
    empty = mx.zeros((0, 32))
    assert _launch.conv_launch(empty, mx.zeros((0, 2, 2)), mx.zeros((2, 32)), 16) is None
    u, h, p, s = mx.zeros((3, 4)), mx.zeros((3, 8)), mx.zeros((3, 4, 8)), mx.zeros((3, 4, 8))
    assert _launch.pair_scores_launch(u, h, p, s) is not None
    assert _launch.pair_scores_launch(u, h, p, s.astype(mx.int32)) is None
    assert _launch.pair_scores_launch(u, h[:2], p, s) is None
    assert _launch.walk_launch(mx.zeros((3, 4, 4), mx.bfloat16), 0.0) is None
    assert _launch.walk_launch(mx.zeros((3, 2, 4)), 0.0) is None  # P < K beyond step 0
    assert _launch.walk_launch(mx.zeros((1, 1, 4)), 0.0) is not None
    assert _launch.walk_launch(mx.zeros((3, 4, 4)), 1.0, None) is None  # sampled needs uniforms
    assert _launch.expected_walk_launch(mx.zeros((3, 4, 4), mx.bfloat16), 1.0) is None
    assert _launch.expected_walk_launch(mx.zeros((3, 2, 4)), 1.0) is None
    assert _launch.expected_walk_launch(mx.zeros((1, 1, 4)), 1.0) is not None


class _Recorder:
    """A launcher that can run anywhere and records what it is asked to run."""

    name = "recorder"

    def __init__(self, execute=None):
        self.calls, self.execute = [], execute

    def unavailable(self):
        return None

    def device(self):
        return "recorder"

    def __call__(self, launch, source):
        self.calls.append(launch)
        return self.execute(launch)


def test_ops_use_the_references_when_kernels_are_inactive():
    recorder = _Recorder()
    with kernels.override(launcher=recorder, setting=_settings.resolve("off")):
        _ops_against_references()
    assert not recorder.calls


def _ops_against_references():
    x, dyn, base = _conv_inputs((1,), 5, 32, 16, mx.float32, seed=1)
    assert mx.array_equal(
        kernels.dynamic_conv(x, dyn, base, 16), conv_ref.dynamic_conv(x, dyn, base, 16)
    )
    args = _pair_inputs((3,), 4, 4, 8, (mx.float32,) * 4, 1.0, seed=2)
    assert mx.array_equal(kernels.pair_scores(*args), sel_ref.pair_scores(*args))
    lat = lattice((), 3, 4, seed=3)
    assert (
        kernels.walk(lat, 0.5, mx.random.key(1))[0].tolist()
        == sel_ref.walk(lat, 0.5, mx.random.key(1))[0].tolist()
    )
    want = sel_ref.expected_walk(lat, 1.0)[0]
    assert kernels.expected_walk_choices(lat, 1.0).tolist() == want.tolist()


@pytest.fixture
def kernels_via():
    """Route launches to an executor (the harness or Metal) under `auto`, as if Metal were
    present (the dispatch's launcher is swapped; the kernels' self-checks run through it)."""
    with contextlib.ExitStack() as stack:

        def route(execute):
            launcher = _Recorder(execute)
            stack.enter_context(
                kernels.override(launcher=launcher, setting=_settings.resolve("auto"))
            )

        yield route


def test_model_paths_through_the_kernels(run_kernel, kernels_via):
    """GroupedDynamicConv and CandidateSelector routed through the kernels (the harness here,
    the GPU on a Mac): same outputs, and the conv / pair-score gradients are the references'."""
    calls = []
    kernels_via(lambda launch: calls.append(launch.spec.name) or run_kernel(launch))
    assert kernels.kernels_active()
    conv = GroupedDynamicConv(32, 2, 16)
    ks = mx.random.split(mx.random.key(11), 4)
    conv.base_kernel = mx.random.normal((2, 2, 32), key=ks[0])
    conv.kernel_projection.weight = 0.1 * mx.random.normal((2 * 2 * 2, 32), key=ks[1])
    u = mx.random.normal((2, 6, 32), key=ks[2])

    def loss(params, u):
        conv.update(params)
        x, dyn = conv.prepare(u)
        return (conv.finish(mx.tanh(x), dyn) * mx.arange(32)).sum()

    params = conv.trainable_parameters()
    val, (g_params, g_u) = mx.value_and_grad(loss, argnums=(0, 1))(params, u)
    assert calls.count("dflash2_dynamic_conv") >= 2
    with monkeypatch_reference():
        want_val, (w_params, w_u) = mx.value_and_grad(loss, argnums=(0, 1))(params, u)
    np.testing.assert_allclose(val.item(), want_val.item(), rtol=1e-5)
    np.testing.assert_allclose(np.array(g_u), np.array(w_u), rtol=1e-4, atol=1e-5)
    for got, want in (
        (g_params["base_kernel"], w_params["base_kernel"]),
        (g_params["kernel_projection"]["weight"], w_params["kernel_projection"]["weight"]),
    ):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)

    sel = CandidateSelector(24, 50, 40, 16)
    sel.walk_calibration = None  # greedy drafts by the stepwise walk: its kernel
    sel.successor_codebook = 0.05 * mx.random.normal((50, 40), key=ks[3])
    hid = mx.random.normal((5, 24), key=mx.random.key(12))
    logits = 4 * mx.random.normal((5, 50), key=mx.random.key(13))
    calls.clear()
    greedy = sel.select(hid, logits, mx.array(7), 0.0)
    sampled = sel.select(hid, logits, mx.array(7), 0.8, mx.random.key(14))
    assert {"dflash2_pair_scores", "dflash2_walk_greedy", "dflash2_walk_sampled"} <= set(calls)
    with monkeypatch_reference():
        want_g = sel.select(hid, logits, mx.array(7), 0.0)
        cand, scores = sel.lattice(hid, logits, mx.array(7))
    assert greedy.tokens.tolist() == want_g.tokens.tolist() and greedy.q is None
    # Sampled: the reference walk on the reference lattice with the key's uniforms.
    idx, q = _reference.walk_with_uniforms(
        scores, 0.8, _reference.draw_walk_uniforms((), 5, 16, mx.random.key(14))
    )
    assert sampled.tokens.tolist() == mx.take_along_axis(cand, idx[:, None], axis=-1)[:, 0].tolist()
    np.testing.assert_allclose(np.array(sampled.q), np.array(q), rtol=1e-5, atol=1e-6)

    def sel_loss(w):
        sel.successor_codebook = w
        _, scores = sel.lattice(hid, logits, mx.array(7))
        return mx.logsumexp(scores, axis=-1).sum()

    w = sel.successor_codebook
    g_k = mx.grad(sel_loss)(w)
    with monkeypatch_reference():
        g_r = mx.grad(sel_loss)(w)
    np.testing.assert_allclose(np.array(g_k), np.array(g_r), rtol=1e-4, atol=1e-6)


def test_selector_greedy_drafts_take_the_expected_walk_kernel(run_kernel, kernels_via):
    """By default (walk_calibration set) greedy drafts launch the expected walk's kernel, not
    the stepwise walk's, and draft what the reference path drafts."""
    calls = []
    kernels_via(lambda launch: calls.append(launch.spec.name) or run_kernel(launch))
    sel = CandidateSelector(24, 50, 40, 16)
    assert sel.walk_calibration is not None
    # Pair scores as large as the unary ones: the expected walk leaves the stepwise path.
    sel.hidden_projection.weight = 0.2 * mx.random.normal((40, 24), key=mx.random.key(40))
    sel.predecessor_codebook = mx.random.normal((50, 40), key=mx.random.key(30))
    sel.successor_codebook = 0.3 * mx.random.normal((50, 40), key=mx.random.key(15))
    hid = mx.random.normal((2, 5, 24), key=mx.random.key(16))
    logits = mx.random.normal((2, 5, 50), key=mx.random.key(17))
    anchor = mx.array([7, 9])
    got = sel.select(hid, logits, anchor, 0.0)
    assert "dflash2_walk_expected" in calls and "dflash2_walk_greedy" not in calls
    with monkeypatch_reference():
        want = sel.select(hid, logits, anchor, 0.0)
        _, scores = sel.lattice(hid, logits, anchor)
    assert got.tokens.tolist() == want.tokens.tolist() and got.q is None
    stepwise = sel_ref.walk(scores, 0.0)[0]
    expected = sel_ref.expected_walk(scores, sel.walk_calibration)[0]
    assert not mx.array_equal(expected, stepwise)  # the two walks differ here


def monkeypatch_reference():
    """Force the references for a block (as DFLASH2_KERNELS=off)."""
    return kernels.override(setting=_settings.resolve("off"))


# ----------------------------------------------------------------------------- bench, Metal-only
def test_bench_kernels_reports_what_ran():
    report = kernels.bench_kernels(repeats=1, warmup=0)
    assert report["kernels_run"] == kernels.metal_available() == report["metal"]
    ops = [r["op"] for r in report["results"]]
    assert {"dynamic_conv", "pair_scores", "walk_greedy", "walk_sampled", "walk_expected"} <= set(
        ops
    )
    for row in report["results"]:
        assert row["reference_ms"] > 0
        assert (row["kernel_ms"] is None) == (not report["kernels_run"])
    if not report["kernels_run"]:
        assert "not run" in report["note"]


@pytest.mark.parametrize("spec_name", sorted(kernels.SPECS))
def test_metal_generated_source_matches_the_harness(capfd, spec_name):
    """On a Mac: MLX's own generated source (verbose=True) is what the harness compiles, for
    every kernel and each dtype combination `doctor --kernels` checks."""
    require_metal()
    spec = kernels.SPECS[spec_name]
    launcher = kernels.MetalLauncher()
    name = re.compile(r"custom_kernel_\w+")  # names carry MLX-version-specific suffixes
    for dtypes in _checks.DOCTOR_DTYPES[spec_name]:
        launch = _checks.case(spec, dtypes).launch
        capfd.readouterr()
        source = kernels.kernel_source(spec.file)
        mx.eval(launcher.kernel(spec, source)(**launch.kwargs(), verbose=True, stream=mx.gpu))
        printed = capfd.readouterr().out
        gen = signature.generate(
            spec.name,
            list(spec.input_names),
            list(spec.output_names),
            source,
            spec.header,
            [
                signature.InputInfo(n, a.dtype, a.ndim, a.size)
                for n, a in zip(spec.input_names, launch.inputs)
            ],
            list(launch.output_dtypes),
            launch.template,
        )
        assert name.sub("K", gen.source.strip()) in name.sub("K", printed), (dtypes, printed)
