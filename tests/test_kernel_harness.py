"""The CPU harness itself (tests/harness): what it models of Metal and what it refuses.

The harness compiles each kernel body inside the signature MLX generates, as C++14 against
metal_shim.h, after msl_lint.py has rejected what C++ accepts and MSL does not; test_kernels.py
runs the kernels on it. These tests pin the model down: 16-bit float conversions bit for bit,
the generated signature, guard zones, work-item attributes, the MSL rules, the threadgroup cap
and the precise / fast math split.
"""

from __future__ import annotations

import re

import mlx.core as mx
import numpy as np
import pytest
from harness import msl_lint, runner, signature

from dflash2_mlx import kernels


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if runner.find_compiler() is None:
        pytest.skip("no C++ compiler (g++, c++, clang++ or $CXX): CPU kernel harness not run")
    return runner.CpuMetal(tmp_path_factory.getbasetemp() / "metal_harness")


CAST_BODY = "uint i = thread_position_in_grid.x;\nout[i] = static_cast<T>(inp[i]);"
WIDEN_BODY = "uint i = thread_position_in_grid.x;\nout[i] = float(inp[i]);"


def _cast(cpu, body, x, out_dtype, t):
    return cpu.run(
        "cast",
        ["inp"],
        ["out"],
        body,
        [x],
        [x.shape],
        [out_dtype],
        (x.size, 1, 1),
        (256, 1, 1),
        [("T", t)],
    )[0]


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16], ids=str)
def test_harness_half_and_bfloat_match_mlx_bit_for_bit(harness, dtype):
    bits = mx.arange(0, 65536, dtype=mx.uint32).astype(mx.uint16)
    every = bits.view(dtype)  # all 65536 encodings
    widened = _cast(harness, WIDEN_BODY, every, mx.float32, dtype)
    want = np.array(every.astype(mx.float32))
    got = np.array(widened)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan], want[~nan])
    # Narrowing: every representable value, the midpoints between neighbours (ties to even),
    # one float ulp either side of them, random floats across the range, and specials.
    vals = want[np.isfinite(want)].astype(np.float32)
    vals = np.unique(vals)
    mids = ((vals[:-1].astype(np.float64) + vals[1:]) / 2).astype(np.float32)
    probes = np.concatenate(
        [
            vals,
            mids,
            np.nextafter(mids, np.float32(np.inf)),
            np.nextafter(mids, np.float32(-np.inf)),
            np.random.default_rng(0).standard_normal(20000).astype(np.float32)
            * np.float32(10.0)
            ** np.random.default_rng(1).integers(-30, 30, 20000).astype(np.float32),
            np.array(
                [
                    0.0,
                    -0.0,
                    np.inf,
                    -np.inf,
                    np.nan,
                    65504,
                    65519.99,
                    65520,
                    65536,
                    1e38,
                    3e-8,
                    2.98e-8,
                    5.96e-8,
                    1e-45,
                    -1e-45,
                ],
                dtype=np.float32,
            ),
        ]
    ).astype(np.float32)
    x = mx.array(probes)
    got = np.array(_cast(harness, CAST_BODY, x, dtype, dtype).view(mx.uint16))
    want = np.array(x.astype(dtype).view(mx.uint16))
    back = np.array(x.astype(dtype).astype(mx.float32))
    nan = np.isnan(back)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.all(np.isnan(np.array(mx.array(got).view(dtype).astype(mx.float32))[nan]))


def test_harness_generates_mlx_signature():
    body = "uint i = thread_position_in_grid.x;\nout[i] = static_cast<T>(x[i] * s + x_shape[0]);"
    infos = [
        signature.InputInfo("x", mx.float16, 2, 64),
        signature.InputInfo("s", mx.float32, 0, 1),
        signature.InputInfo("w", mx.int32, 1, 3),
    ]
    gen = signature.generate(
        "demo",
        ["x", "s", "w"],
        ["out"],
        body,
        "",
        infos,
        [mx.float16],
        (("T", mx.float16), ("N", 4), ("B", True)),
    )
    assert (
        gen.kernel_name == "custom_kernel_demo__float16_t_4_1_float16_t_floats_int32_tc_float16_t"
    )
    assert gen.source == (
        "template <typename T, int N, bool B>\n"
        f"[[kernel]] void {gen.kernel_name}(\n"
        "  const device float16_t* x [[buffer(0)]],\n"
        "  const constant int* x_shape [[buffer(1)]],\n"
        "  const constant float& s [[buffer(2)]],\n"
        "  const constant int32_t* w [[buffer(3)]],\n"
        "  device float16_t* out [[buffer(4)]],\n"
        "  uint3 thread_position_in_grid [[thread_position_in_grid]]) {\n"
        f"{body}\n}}\n\n"
        f'template [[host_name("{gen.kernel_name}")]] [[kernel]] '
        f"decltype({gen.kernel_name}<float16_t, 4, 1>) {gen.kernel_name}<float16_t, 4, 1>;\n"
    )


def test_harness_catches_out_of_bounds_and_unwritten_outputs(harness):
    x = mx.arange(16, dtype=mx.float32)

    def run(body, n):
        return harness.run(
            "oob", ["inp"], ["out"], body, [x], [(n,)], [mx.float32], (16, 1, 1), (16, 1, 1)
        )[0]

    with pytest.raises(AssertionError, match="out of bounds"):
        run("uint i = thread_position_in_grid.x;\nout[i + 1u] = inp[i];", 16)
    got = np.array(run("uint i = thread_position_in_grid.x;\nout[i] = inp[i + 1u];", 16))
    assert np.isnan(got[15]) and np.array_equal(got[:15], np.arange(1, 16))  # guard read: NaN
    got = np.array(run("uint i = thread_position_in_grid.x;\nout[2u * i] = inp[i];", 32))
    assert np.isnan(got[1::2]).all()  # never written: NaN


def test_harness_models_grid_attributes_shapes_and_strides(harness):
    """The work-item attributes the loop provides, on a 3-D grid that the threadgroup does not
    divide, plus the _shape / _strides / _ndim buffers."""
    body = """uint3 p = thread_position_in_grid;
uint3 n = threads_per_grid;
uint i = (p.z * n.y + p.y) * n.x + p.x;
out[i] = int32_t(thread_position_in_threadgroup.x * 1000000u
    + threadgroup_position_in_grid.x * 10000u + thread_position_in_threadgroup.y * 1000u + uint(inp_strides[0]) * 10u
    + uint(inp_shape[1]) + uint(inp_ndim));"""
    grid, group = (10, 5, 2), (4, 3, 1)
    x = mx.zeros((3, 5, 7))
    got = np.array(
        harness.run("attrs", ["inp"], ["out"], body, [x], [(2, 5, 10)], [mx.int32], grid, group)[0]
    )
    z, y, xx = np.meshgrid(range(2), range(5), range(10), indexing="ij")
    want = (xx % 4) * 1000000 + (xx // 4) * 10000 + (y % 3) * 1000 + 35 * 10 + 5 + 3
    np.testing.assert_array_equal(got, want)
    with pytest.raises(runner.NotModelled):
        harness.run(
            "simd",
            ["inp"],
            ["out"],
            "out[0] = int32_t(thread_index_in_simdgroup);",
            [x],
            [(1,)],
            [mx.int32],
            (1, 1, 1),
            (1, 1, 1),
        )


# The harness refuses what Metal refuses (each body compiles as C++ here).
MSL_VIOLATIONS = [
    ("float v = float(std::abs(inp[i]));", "std::"),
    ("double v = double(inp[i]);", "double"),
    ("out[i] = inp[i] * 0.5;", "without an `f` suffix"),
    ("out[i] = inp[i] * 1e-3;", "without an `f` suffix"),
    ("out[i] = [](float a) { return a; }(inp[i]);", "lambda"),
    ("float* p = new float[2];\nout[i] = inp[i];\ndelete[] p;", "`new`"),
    ("static uint calls = 0u;\nout[i] = inp[i];", "`static`"),
    ("const float* p = inp;\nout[i] = p[i];", "pointer to `float` without an address space"),
    ("const float& r = inp[i];\nout[i] = r;", "reference to `float` without an address space"),
    ("uint half = i;\nout[i] = inp[half];", "`half` names a variable"),
    ("float float2 = inp[i];\nout[i] = float2;", "`float2` names a variable"),
    ("const device float* p = inp;\nout[i] = p[i];", "`device`"),
    ("out[i] = exp(inp[i]);", "`exp(` without `metal::`"),
    ("out[i] = fmax(inp[i], 0.0f);", "`fmax(` without `metal::`"),
]


@pytest.mark.parametrize("line, why", MSL_VIOLATIONS, ids=[w for _, w in MSL_VIOLATIONS])
def test_harness_rejects_what_metal_rejects(harness, line, why):
    body = "uint i = thread_position_in_grid.x;\n" + line
    x = mx.arange(16, dtype=mx.float32)
    with pytest.raises(runner.MslViolation, match=re.escape(why)):
        harness.run(
            "msl", ["inp"], ["out"], body, [x], [(16,)], [mx.float32], (16, 1, 1), (16, 1, 1)
        )


def test_shipped_bodies_are_clean_msl():
    for spec in kernels.SPECS.values():
        assert msl_lint.lint(kernels.kernel_source(spec.file), spec.template_names) == [], spec.file


def test_harness_compiles_as_cpp14_and_caps_threadgroups(harness):
    """MSL is C++14: a C++17 construct fails here as on a Mac; Metal runs at most 1024
    threads per threadgroup."""
    x = mx.arange(16, dtype=mx.float32)

    def run(body, group):
        return harness.run(
            "cxx14", ["inp"], ["out"], body, [x], [(16,)], [mx.float32], (16, 1, 1), group
        )

    body = "uint i = thread_position_in_grid.x;\nout[i] = inp[i];"
    assert np.array_equal(np.array(run(body, (16, 1, 1))[0]), np.arange(16))
    with pytest.raises(RuntimeError, match="compile failed"):
        run(
            "uint i = thread_position_in_grid.x;\nif constexpr (true) { out[i] = inp[i]; }",
            (16, 1, 1),
        )
    with pytest.raises(AssertionError, match="1024"):
        run(body, (32, 32, 2))
    with pytest.raises(AssertionError, match="1024"):
        run(body, (0, 1, 1))


def test_harness_models_precise_and_fast_math(harness):
    """metal::precise:: is the C library's math, metal::fast:: the fast-math evaluation (exp
    via exp2, NaN operands of max unspecified); unqualified exp / log / max on float do not
    compile: on Metal their precision follows the library's math mode."""
    x = mx.array(np.linspace(-80, 80, 1601, dtype=np.float32))

    def run(expr):
        return np.array(
            harness.run(
                "math",
                ["inp"],
                ["out"],
                f"uint i = thread_position_in_grid.x;\nout[i] = {expr};",
                [x],
                [x.shape],
                [mx.float32],
                (x.size, 1, 1),
                (256, 1, 1),
            )[0]
        )

    want = np.exp(np.array(x).astype(np.float64))
    precise, fast = run("metal::precise::exp(inp[i])"), run("metal::fast::exp(inp[i])")

    def rel(got):
        return np.abs(got - want) / want

    assert rel(precise).max() < 2**-23 and 2**-20 < rel(fast).max() < 2**-12
    logs = run("metal::precise::log(metal::precise::exp(inp[i] / 16.0f))")
    np.testing.assert_allclose(logs, np.array(x) / 16, rtol=1e-6, atol=1e-6)
    nan_max = run("metal::precise::max(inp[i] - inp[i] * (inp[i] > 0.0f ? 0.0f : NAN), 1.0f)")
    assert not np.isnan(nan_max).any()  # a NaN operand loses
    for unqualified in ("metal::exp(inp[i])", "metal::log(inp[i])", "metal::max(inp[i], 1.0f)"):
        with pytest.raises(RuntimeError, match="deleted"):
            run(unqualified)


def test_kernel_bodies_stay_within_the_harness_model():
    """The harness makes address spaces empty macros and models only some attributes: bodies
    must not name address spaces (a constant/device mismatch would only fail on a Mac), and
    may use only modelled attributes, no SIMD-group, threadgroup-memory or atomic features."""
    assert set(kernels.SPECS) == {
        "dflash2_dynamic_conv",
        "dflash2_pair_scores",
        "dflash2_walk_greedy",
        "dflash2_walk_sampled",
        "dflash2_walk_expected",
    }
    for spec in kernels.SPECS.values():
        src = kernels.kernel_source(spec.file)
        code = re.sub(r"//[^\n]*", "", src)
        assert not re.search(r"\b(device|constant|thread|threadgroup)\b", code), spec.file
        assert not re.search(r"simd_|quad_|atomic|barrier", code), spec.file
        for attr, _ in signature.attributes(src):
            assert attr in runner.MODELLED_ATTRIBUTES, (spec.file, attr)
        assert "thread_position_in_grid" in code
