"""The optimized BLAS is bound on Linux (and can be opted out of)."""

import json
import os
import subprocess
import sys

import pytest

import dflash2_mlx

PROBE = (
    "import json, time, dflash2_mlx, mlx.core as mx\n"
    "a = mx.random.normal((512, 512)); mx.eval(a)\n"
    "mx.eval(a @ a); t = time.perf_counter()\n"
    "for _ in range(5): mx.eval(a @ a)\n"
    "ms = (time.perf_counter() - t) * 200\n"
    "d = dflash2_mlx.doctor(); d['ms'] = ms\n"  # doctor() imports the API: not timed
    "print(json.dumps(d))\n"
)


def probe(env_extra, code=PROBE):
    env = dict(os.environ, **env_extra)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding only acts on Linux")
def test_openblas_is_bound_and_faster_than_stock():
    fast, _ = probe({"DFLASH2_BLAS": "auto"})
    slow, _ = probe({"DFLASH2_BLAS": "stock"})
    assert fast["blas"] in ("system-openblas", "scipy-openblas"), fast
    assert slow["blas"] == "stock"
    # Reference BLAS: ~4 GFLOP/s; OpenBLAS is many times faster even on a busy machine.
    assert fast["ms"] * 2 < slow["ms"], (fast["ms"], slow["ms"])


def test_doctor_reports_runtime():
    d = dflash2_mlx.doctor()
    for key in ("platform", "mlx", "mlx_lm", "device", "blas", "metal", "cache_dir"):
        assert key in d
    assert d["mlx"] != "?"
    assert d["dflash2"] == dflash2_mlx.__version__  # a bug report says which release
    assert str(dflash2_mlx.paths.cache_root() / "autotune") in d["autotune"]


@pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64",
    reason="OpenBLAS kernel sets are chosen per x86-64 CPU",
)
def test_the_openblas_kernel_set_is_reported():
    """`doctor` names the kernels OpenBLAS really runs (what OPENBLAS_CORETYPE forces)."""
    forced, _ = probe({"DFLASH2_BLAS": "auto", "OPENBLAS_CORETYPE": "Haswell"})
    assert forced["blas_core"] == "Haswell", forced


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding only acts on Linux")
def test_importing_mlx_first_is_warned_about():
    """MLX loaded before dflash2_mlx keeps its slow reference BLAS: the user is told why."""
    code = "import mlx.core, dflash2_mlx"
    late = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert late.returncode == 0, late.stderr
    assert "import dflash2_mlx first" in late.stderr
    ok = subprocess.run(
        [sys.executable, "-c", "import dflash2_mlx, mlx.core"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "import dflash2_mlx first" not in ok.stderr, ok.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding only acts on Linux")
def test_a_cache_that_cannot_be_written_still_gets_the_fast_blas(tmp_path):
    """The shim was built only in the cache: a read-only one meant the 4x slower reference
    BLAS. (A folder under a file: unwritable even for root.)"""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    fast, err = probe({"DFLASH2_BLAS": "auto", "DFLASH2_HOME": str(blocker / "home")})
    assert fast["blas"] in ("system-openblas", "scipy-openblas"), (fast, err)


# --- the shim's few-row kernel (dflash2_mlx/cblas_shim.c) ------------------------------------

LINUX_X86 = sys.platform == "linux" and os.uname().machine == "x86_64"


def _kernel_product(shim, level, a, b):
    """C = A @ B.T by the shim's kernel at `level`; None where this CPU lacks that level."""
    import ctypes

    import numpy as np

    m, k = a.shape
    n = b.shape[0]
    c = np.full((m, n), np.nan, dtype=np.float32)
    ptr = ctypes.POINTER(ctypes.c_float)
    used = shim.dflash2_skinny_sgemm(
        level, m, n, k,
        a.ctypes.data_as(ptr), a.strides[0] // 4,
        b.ctypes.data_as(ptr), b.strides[0] // 4,
        c.ctypes.data_as(ptr), n,
    )  # fmt: skip
    return c if used == level else None


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
@pytest.mark.parametrize("level", [1, 2], ids=["avx2", "avx512"])
def test_the_few_row_kernel_computes_a_times_b_transposed(level):
    """Every row count up to the cap, sizes that are not multiples of the vector width, and rows
    that are slices of wider arrays (lda / ldb larger than k), against float64."""
    import ctypes

    import numpy as np

    from dflash2_mlx import _blas

    shim = ctypes.CDLL(str(_blas._shim()))
    rng = np.random.default_rng(level)
    checked = 0
    for m in range(1, _blas.KERNEL_MAX_ROWS + 1):
        n, k = int(rng.integers(1, 70)), int(rng.integers(1, 300))
        a = rng.standard_normal((m, k + 5), dtype=np.float32)[:, :k]
        b = rng.standard_normal((n, k + 3), dtype=np.float32)[:, :k]
        c = _kernel_product(shim, level, a, b)
        if c is None:
            pytest.skip(f"this CPU has no {'AVX-512' if level == 2 else 'AVX2 + FMA'}")
        exact = a.astype(np.float64) @ b.astype(np.float64).T
        bound = 1e-6 * k * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T)
        assert np.all(np.abs(c - exact) <= bound + 1e-30), (m, n, k)
        checked += 1
    assert checked == _blas.KERNEL_MAX_ROWS


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
@pytest.mark.parametrize("level", [1, 2], ids=["avx2", "avx512"])
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(level):
    """Each output is summed in one fixed order, so a token's product is the same alone and in
    a verify of several (exact by construction: the same instructions on the same numbers)."""
    import ctypes

    import numpy as np

    from dflash2_mlx import _blas

    shim = ctypes.CDLL(str(_blas._shim()))
    rng = np.random.default_rng(7)
    a = rng.standard_normal((9, 200), dtype=np.float32)
    b = rng.standard_normal((37, 200), dtype=np.float32)
    whole = _kernel_product(shim, level, a, b)
    if whole is None:
        pytest.skip(f"this CPU has no {'AVX-512' if level == 2 else 'AVX2 + FMA'}")
    for i in range(9):
        alone = _kernel_product(shim, level, np.ascontiguousarray(a[i : i + 1]), b)
        assert np.array_equal(alone[0], whole[i]), i


KERNEL_PROBE = (
    "import json, dflash2_mlx, mlx.core as mx, numpy as np\n"
    "rng = np.random.default_rng(0); worst = 0.0\n"
    "for m in (1, 3, 4, 17, 24, 25, 40):\n"  # the kernel's rows and OpenBLAS's beyond them
    "    a = rng.standard_normal((m, 333), dtype=np.float32)\n"
    "    w = rng.standard_normal((129, 333), dtype=np.float32)\n"
    "    got = np.array(mx.array(a) @ mx.array(w).T)\n"
    "    exact = a.astype(np.float64) @ w.astype(np.float64).T\n"
    "    worst = max(worst, float(np.abs(got - exact).max()))\n"
    "info = dflash2_mlx._blas.info()\n"
    "print(json.dumps({'kernel': info.kernel, 'rows': info.kernel_rows,\n"
    "                  'threads': info.threads, 'worst': worst}))\n"
)


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
def test_mlx_products_go_through_the_kernel_by_thread_count_and_not_when_opted_out():
    """At one BLAS thread the kernel takes up to 24 rows, at two up to 4 (where it beat
    OpenBLAS's two threads); DFLASH2_BLAS=openblas turns it off."""
    on, _ = probe({"DFLASH2_BLAS": "auto", "DFLASH2_BLAS_THREADS": "1"}, KERNEL_PROBE)
    off, _ = probe({"DFLASH2_BLAS": "openblas", "DFLASH2_BLAS_THREADS": "1"}, KERNEL_PROBE)
    two, _ = probe({"DFLASH2_BLAS": "auto", "DFLASH2_BLAS_THREADS": "2"}, KERNEL_PROBE)
    if on["kernel"] is None:
        with open("/proc/cpuinfo") as f:
            assert " avx2 " not in f.read(), "an AVX2 CPU should run the kernel at 1 thread"
        pytest.skip("this CPU has no AVX2")
    assert on["kernel"] in ("avx2", "avx512") and on["rows"] == 24, on
    assert off["kernel"] is None and off["rows"] == 0, off
    # OpenBLAS runs at most as many threads as the machine has cores
    assert two["rows"] == {1: 24, 2: 4}[two["threads"]], two
    assert max(on["worst"], off["worst"], two["worst"]) < 1e-2, (on, off, two)
