"""The optimized BLAS is bound on Linux (and can be opted out of)."""

import json
from pathlib import Path
import os
import subprocess
import sys
import time

import pytest

import dflash2_mlx

PROBE = (
    "import json, time, dflash2_mlx, mlx.core as mx\n"
    "a = mx.random.normal((512, 512)); mx.eval(a)\n"
    "mx.eval(a @ a); times = []\n"
    "for _ in range(7):\n"  # the quickest: what a busy machine leaves of the speed
    "    t = time.perf_counter(); mx.eval(a @ a); times.append(time.perf_counter() - t)\n"
    "ms = min(times) * 1000\n"
    "d = dflash2_mlx.doctor(); d['ms'] = ms\n"  # doctor() imports more: not timed
    "print(json.dumps(d))\n"
)


def probe(env_extra, code=PROBE, drop=()):
    """Run `code` in a fresh interpreter with `env_extra` set and the `drop` variables unset."""
    env = {k: v for k, v in os.environ.items() if k not in drop} | env_extra
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


def _kernel_product(shim, level, a, b, c=None, threads=1):
    """C = A @ B.T by the shim's kernel at `level` over `threads` threads into `c` (a fresh
    array when None; it may be a view of wider rows); None where this CPU lacks that level."""
    import ctypes

    import numpy as np

    m, k = a.shape
    n = b.shape[0]
    c = np.full((m, n), np.nan, dtype=np.float32) if c is None else c
    ptr = ctypes.POINTER(ctypes.c_float)
    used = shim.dflash2_skinny_sgemm(
        level, threads, m, n, k,
        a.ctypes.data_as(ptr), a.strides[0] // 4,
        b.ctypes.data_as(ptr), b.strides[0] // 4,
        c.ctypes.data_as(ptr), c.strides[0] // 4,
    )  # fmt: skip
    return c if used == level else None


def _before_a_guard_page(values, ld, keep):
    """`values` [rows, cols] copied into rows `ld` floats apart whose last float ends where a
    page that cannot be read begins: a read past the matrix faults (and fails the test run)."""
    import ctypes
    import mmap

    import numpy as np

    rows, cols = values.shape
    count = (rows - 1) * ld + cols
    data_pages = -(-count * 4 // mmap.PAGESIZE)
    buf = mmap.mmap(-1, (data_pages + 1) * mmap.PAGESIZE)
    flat = np.frombuffer(buf, np.float32, count, data_pages * mmap.PAGESIZE - count * 4)
    view = np.lib.stride_tricks.as_strided(flat, (rows, cols), (ld * 4, 4))
    view[...] = values
    guard = ctypes.addressof(ctypes.c_char.from_buffer(buf)) + data_pages * mmap.PAGESIZE
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(guard), mmap.PAGESIZE, 0) == 0
    keep.append(buf)
    return view


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
@pytest.mark.parametrize("level", [1, 2], ids=["avx2", "avx512"])
def test_the_few_row_kernel_computes_a_times_b_transposed(level):
    """Every row count up to the cap against float64, with sizes that are not multiples of the
    vector width; A and B end at an unreadable page and their rows sit wider apart than k, C's
    rows wider than n with sentinels around the product (reads and writes stay inside); a NaN
    and an infinity in A give what they give in any sum."""
    import ctypes

    import numpy as np

    from dflash2_mlx import _blas, _blas_shim

    shim = ctypes.CDLL(str(_blas_shim.shim()))
    rng = np.random.default_rng(level)
    keep = []
    for m in range(1, _blas.KERNEL_MAX_ROWS + 1):
        n, k = int(rng.integers(1, 70)), int(rng.integers(1, 300))
        a_values = rng.standard_normal((m, k), dtype=np.float32)
        a_values[0, k // 2] = np.nan
        a_values[-1, -1] = np.inf if m > 1 else a_values[-1, -1]
        a = _before_a_guard_page(a_values, k + 5, keep)
        b = _before_a_guard_page(rng.standard_normal((n, k), dtype=np.float32), k + 3, keep)
        out = np.full((m + 1, n + 2), 7.5, dtype=np.float32)
        c = _kernel_product(shim, level, a, b, out[:m, :n])
        if c is None:
            pytest.skip(f"this CPU has no {'AVX-512' if level == 2 else 'AVX2 + FMA'}")
        assert np.all(out[:, n:] == 7.5) and np.all(out[m:] == 7.5), (m, n, k)  # untouched
        exact = a_values.astype(np.float64) @ b.astype(np.float64).T
        assert np.array_equal(np.isnan(c), np.isnan(exact)), (m, n, k)
        assert np.array_equal(c[np.isinf(exact)], exact[np.isinf(exact)]), (m, n, k)
        finite = np.isfinite(exact)
        scale = np.abs(np.nan_to_num(a_values, posinf=0)).astype(np.float64) @ np.abs(b).T
        error = np.abs(c[finite] - exact[finite])
        assert np.all(error <= 1e-6 * k * scale[finite] + 1e-30), (m, n, k)


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
@pytest.mark.parametrize("level", [1, 2], ids=["avx2", "avx512"])
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(level):
    """Each output is summed in one fixed order, so a token's product is the same alone and in
    a verify of several (exact by construction: the same instructions on the same numbers)."""
    import ctypes

    import numpy as np

    from dflash2_mlx import _blas_shim

    shim = ctypes.CDLL(str(_blas_shim.shim()))
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
    "import ctypes, json, dflash2_mlx, mlx.core as mx, numpy as np\n"
    "from dflash2_mlx import _blas, _blas_shim\n"
    "info = _blas.info(); level = {'avx2': 1, 'avx512': 2}.get(info.kernel)\n"
    "shim = ctypes.CDLL(str(_blas_shim.shim())) if level else None\n"
    "ptr = ctypes.POINTER(ctypes.c_float)\n"
    "rng = np.random.default_rng(0); worst = 0.0; as_kernel = {}; as_split = {}\n"
    "N = 1029\n"  # rows of B: enough for a product to be split over threads
    "for m in (1, 3, 4, 17, 24, 25, 40, 48, 49, 130):\n"  # the kernel's rows, OpenBLAS's beyond
    "    a = rng.standard_normal((m, 333), dtype=np.float32)\n"
    "    w = rng.standard_normal((N, 333), dtype=np.float32)\n"
    "    got = np.array(mx.array(a) @ mx.array(w).T)\n"
    "    exact = a.astype(np.float64) @ w.astype(np.float64).T\n"
    "    worst = max(worst, float(np.abs(got - exact).max()))\n"
    "    if level:\n"  # the kernel's own result, bit for bit (its summation order is fixed)
    "        c = np.empty((m, N), np.float32); s = np.empty((m, N), np.float32)\n"
    "        shim.dflash2_skinny_sgemm(level, 1, m, N, 333, a.ctypes.data_as(ptr), 333,\n"
    "                                  w.ctypes.data_as(ptr), 333, c.ctypes.data_as(ptr), N)\n"
    "        as_kernel[m] = bool(np.array_equal(got, c))\n"
    "        shim.dflash2_split_sgemm(1, 111, 112, m, N, 333, ctypes.c_float(1),\n"
    "                                 a.ctypes.data_as(ptr), 333, w.ctypes.data_as(ptr), 333,\n"
    "                                 ctypes.c_float(0), s.ctypes.data_as(ptr), N)\n"
    "        as_split[m] = bool(np.array_equal(got, s))\n"
    "print(json.dumps({'kernel': info.kernel, 'rows': info.kernel_rows, 'threads': info.threads,\n"
    "                  'kthreads': info.kernel_threads, 'split': info.split, 'worst': worst,\n"
    "                  'as_kernel': as_kernel, 'as_split': as_split}))\n"
)


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
def test_mlx_products_go_through_the_kernel_at_any_thread_count_and_not_when_opted_out():
    """MLX's products of up to 24 rows (48 where it splits) are the kernel's own, bit for bit,
    at one BLAS thread, at two and by default (split over its pool there: the same sums
    whichever thread makes them), none under DFLASH2_BLAS=openblas; all are right within
    float32's rounding. The kernel runs DFLASH2_BLAS_THREADS's count where it is set
    (OpenBLAS's too), else at least 2 where there are 2 cores, whatever OPENBLAS_NUM_THREADS
    says (a dflash2 parent sets it).
    Where OpenBLAS runs one thread and the kernel more (the default on 2 cores), the kernel
    takes up to 48 rows and larger products are OpenBLAS's in the shim's chunks."""
    from dflash2_mlx import _blas_shim

    on, _ = probe({"DFLASH2_BLAS": "auto", "DFLASH2_BLAS_THREADS": "1"}, KERNEL_PROBE)
    off, _ = probe({"DFLASH2_BLAS": "openblas", "DFLASH2_BLAS_THREADS": "1"}, KERNEL_PROBE)
    two, _ = probe({"DFLASH2_BLAS": "auto", "DFLASH2_BLAS_THREADS": "2"}, KERNEL_PROBE)
    # a product of 333 terms of N(0, 1)^2: float32's error is ~1e-4 here, a wrong sum is ~10
    assert max(on["worst"], off["worst"], two["worst"]) < 1e-2, (on, off, two)
    assert off["kernel"] is None and off["rows"] == 0, off
    if on["kernel"] is None:
        try:
            _blas_shim.shim()
        except (OSError, RuntimeError) as exc:
            pytest.skip(f"the BLAS shim cannot be built here: {exc}")
        with open("/proc/cpuinfo") as f:
            assert " avx2 " not in f.read(), "an AVX2 CPU should run the kernel at 1 thread"
        pytest.skip("this CPU has no AVX2")
    # no DFLASH2_BLAS_THREADS: OpenBLAS at half the cores (or at an inherited
    # OPENBLAS_NUM_THREADS), the kernel on at least 2 where there are 2
    default, _ = probe(
        {"DFLASH2_BLAS": "auto", "OPENBLAS_NUM_THREADS": "1"},
        KERNEL_PROBE,
        drop={"DFLASH2_BLAS_THREADS"},
    )
    cores = len(os.sched_getaffinity(0))
    assert default["threads"] == 1 and default["kthreads"] == min(2, cores), default
    assert on["kthreads"] == 1 and two["kthreads"] == two["threads"], (on, two)
    assert default["split"] == (cores >= 2) and not on["split"], (default, on)
    assert not two["split"], two  # OpenBLAS runs threads of its own
    for run in (on, two, default):
        rows = 48 if run["split"] else 24
        assert run["rows"] == rows, run
        assert all(run["as_kernel"][m] for m in run["as_kernel"] if int(m) <= rows), run
        assert not any(run["as_kernel"][m] for m in run["as_kernel"] if int(m) > rows), run
        if run["split"]:
            assert run["as_split"]["49"] and run["as_split"]["130"], run


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
def test_the_avx2_kernel_runs_through_mlx_where_asked():
    """DFLASH2_BLAS=avx2: MLX's few-row products are the AVX2 kernel's own (what a Haswell or
    Zen 2/3 CPU runs), right within float32's rounding; greedy decoding stays exact there."""
    with open("/proc/cpuinfo") as f:
        if " avx2 " not in f.read():
            pytest.skip("this CPU has no AVX2")
    run, err = probe({"DFLASH2_BLAS": "avx2", "DFLASH2_BLAS_THREADS": "2"}, KERNEL_PROBE)
    if run["kernel"] is None:
        pytest.skip(f"the BLAS shim's kernel cannot be built here: {err}")
    assert run["kernel"] == "avx2" and run["worst"] < 1e-2, run
    assert all(run["as_kernel"][str(m)] for m in (1, 3, 4, 17, 24)), run
    code = (
        f"import json, sys, dflash2_mlx; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import tiny\n"
        "from dflash2_mlx import GenerationParams, SpeculativeDecoder\n"
        "from dflash2_mlx.target.adapter import TargetAdapter\n"
        "m = tiny.make_target('qwen3'); d = tiny.make_drafter(2, block_size=8)\n"
        "dec = SpeculativeDecoder(TargetAdapter(m, d.config.target_layer_ids), d)\n"
        "p = [3, 9, 4, 12, 7, 30]\n"
        "got = dec.generate(p, GenerationParams(max_tokens=40, backoff=False))\n"
        "print(json.dumps({'same': got == tiny.greedy_reference(m, p, 40),\n"
        "                  'kernel': dflash2_mlx._blas.info().kernel}))\n"
    )
    out, err = probe({"DFLASH2_BLAS": "avx2"}, code)
    assert out == {"same": True, "kernel": "avx2"}, (out, err)


def _shared_by_threads(product, cases, rounds=12):
    """`product(a, b)` from 3 Python threads at once (they share one pool) gives each case's
    `alone` result bit for bit."""
    import threading

    import numpy as np

    failures = []

    def many(seed):
        for i in range(rounds):
            a, b, alone = cases[(seed + i) % len(cases)]
            if not np.array_equal(product(a, b), alone):
                failures.append((seed, i))

    workers = [threading.Thread(target=many, args=(s,), daemon=True) for s in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers) and not failures, failures


def _helpers_take_chunks(shim, product, case, helped):
    """With two cores or more, the pool's helpers take chunks of `product` (not the caller
    alone); on a busy machine a helper may take a while to run."""
    import numpy as np

    if len(os.sched_getaffinity(0)) < 2:
        return
    a, b, alone = case
    deadline = time.monotonic() + 30
    while shim.dflash2_pool_helper_chunks() == helped and time.monotonic() < deadline:
        assert np.array_equal(product(a, b), alone)
    assert shim.dflash2_pool_helper_chunks() > helped


# (m, n, k) whose products are split into chunks over threads (n * k >= 2^16), with row
# counts and sizes that are not multiples of the vector or chunk widths
THREADS_CASES = [(1, 577, 300), (4, 1029, 333), (13, 4099, 70), (24, 700, 129), (2, 581, 513)]


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
@pytest.mark.parametrize("level", [1, 2], ids=["avx2", "avx512"])
def test_the_kernel_over_threads_gives_the_one_thread_products_bit_for_bit(level):
    """Split over 2-5 threads (chunks of B's rows taken by a pool and the caller), every output
    is the one-thread kernel's, exactly (the same instructions on the same numbers); A and B end
    at an unreadable page and C's rows are wider than n with sentinels (chunk edges stay
    inside); products from several Python threads at once, which share one pool, too. With
    two cores or more, the pool's helpers do take chunks (not the caller alone)."""
    import ctypes

    import numpy as np

    from dflash2_mlx import _blas_shim

    shim = ctypes.CDLL(str(_blas_shim.shim()))
    shim.dflash2_pool_helper_chunks.restype = ctypes.c_long
    helped = shim.dflash2_pool_helper_chunks()
    rng = np.random.default_rng(11)
    keep = []
    cases = []
    for m, n, k in THREADS_CASES:
        a = _before_a_guard_page(rng.standard_normal((m, k), dtype=np.float32), k + 1, keep)
        b = _before_a_guard_page(rng.standard_normal((n, k), dtype=np.float32), k + 3, keep)
        alone = _kernel_product(shim, level, a, b)
        if alone is None:
            pytest.skip(f"this CPU has no {'AVX-512' if level == 2 else 'AVX2 + FMA'}")
        cases.append((a, b, alone))
    for threads in (2, 3, 5):
        for a, b, alone in cases:
            m, n = alone.shape
            out = np.full((m + 1, n + 2), 7.5, dtype=np.float32)
            _kernel_product(shim, level, a, b, out[:m, :n], threads=threads)
            assert np.array_equal(out[:m, :n], alone), (threads, alone.shape)
            assert np.all(out[:, n:] == 7.5) and np.all(out[m:] == 7.5), (threads, alone.shape)
    two_threads = lambda a, b: _kernel_product(shim, level, a, b, threads=2)  # noqa: E731
    _shared_by_threads(two_threads, cases, rounds=20)
    _helpers_take_chunks(shim, two_threads, cases[2], helped)


def _split_product(shim, a, b, c=None, threads=1, ta=False, tb=True, alpha=1.0, beta=0.0):
    """C = alpha * op(A) @ op(B) + beta * C (op: transposed where `ta` / `tb`: A stored k x m,
    B n x k) by OpenBLAS in the shim's chunks over `threads` threads (split_threads); None
    where this build has no pool."""
    import ctypes

    import numpy as np

    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    k = b.shape[1] if tb else b.shape[0]
    c = np.full((m, n), np.nan, dtype=np.float32) if c is None else c
    ptr = ctypes.POINTER(ctypes.c_float)
    used = shim.dflash2_split_sgemm(
        threads, 112 if ta else 111, 112 if tb else 111, m, n, k, ctypes.c_float(alpha),
        a.ctypes.data_as(ptr), a.strides[0] // 4,
        b.ctypes.data_as(ptr), b.strides[0] // 4,
        ctypes.c_float(beta), c.ctypes.data_as(ptr), c.strides[0] // 4,
    )  # fmt: skip
    assert used in (0, -1), used  # -2: a layout these tests should not give
    return c if used == 0 else None


# (m, n, k) of products with more rows than the kernel takes (a prefill's), cut into chunks
# of B's rows or (the last two) too small to cut
SPLIT_CASES = [(65, 1029, 333), (200, 4099, 70), (97, 2050, 129), (300, 130, 64), (70, 900, 20)]


@pytest.mark.skipif(not LINUX_X86, reason="the thread pool is x86-64 code in the Linux shim")
def test_a_large_product_in_chunks_over_threads_is_the_same_at_any_thread_count():
    """OpenBLAS's gemm on chunks of C's columns, taken by the pool and the caller: the chunks
    depend on the shape alone, so the product is the same bit for bit at 1-5 threads and from
    several Python threads at once (a busy pool: the caller takes every chunk), right within
    float32's rounding; A and B end at an unreadable page and C's rows are wider than n with
    sentinels (chunk edges stay inside). With two cores or more, helpers take chunks."""
    import ctypes

    import numpy as np

    from dflash2_mlx import _blas, _blas_shim

    if _blas.info().kernel is None:
        pytest.skip("no kernel on this machine (see the tests above for why)")
    shim = ctypes.CDLL(str(_blas_shim.shim()))
    shim.dflash2_pool_helper_chunks.restype = ctypes.c_long
    helped = shim.dflash2_pool_helper_chunks()
    rng = np.random.default_rng(5)
    keep, cases = [], []
    for m, n, k in SPLIT_CASES:
        a_values = rng.standard_normal((m, k), dtype=np.float32)
        a = _before_a_guard_page(a_values, k + 2, keep)
        b = _before_a_guard_page(rng.standard_normal((n, k), dtype=np.float32), k + 3, keep)
        alone = _split_product(shim, a, b)
        if alone is None:
            pytest.skip("this shim was built without its kernel and pool")
        exact = a_values.astype(np.float64) @ b.astype(np.float64).T
        scale = np.abs(a_values).astype(np.float64) @ np.abs(b).T
        assert np.all(np.abs(alone - exact) <= 1e-6 * k * scale + 1e-30), (m, n, k)
        cases.append((a, b, alone))
    for threads in (2, 3, 5):
        for a, b, alone in cases:
            m, n = alone.shape
            out = np.full((m + 1, n + 2), 7.5, dtype=np.float32)
            _split_product(shim, a, b, out[:m, :n], threads=threads)
            assert np.array_equal(out[:m, :n], alone), (threads, alone.shape)
            assert np.all(out[:, n:] == 7.5) and np.all(out[m:] == 7.5), (threads, alone.shape)
    two_threads = lambda a, b: _split_product(shim, a, b, threads=2)  # noqa: E731
    _shared_by_threads(two_threads, cases, rounds=8)
    _helpers_take_chunks(shim, two_threads, cases[1], helped)


@pytest.mark.skipif(not LINUX_X86, reason="the thread pool is x86-64 code in the Linux shim")
def test_every_layout_in_chunks_is_right_and_the_same_at_any_thread_count():
    """The products of a training step's backward pass (A @ B, Aᵀ @ B, Aᵀ @ Bᵀ, with alpha and
    beta): in chunks over 1-3 threads, the same bit for bit, right within float32's rounding,
    beta scaling what C held; MLX's own products of those layouts are right too."""
    import ctypes

    import mlx.core as mx
    import numpy as np

    from dflash2_mlx import _blas, _blas_shim

    if _blas.info().kernel is None:
        pytest.skip("no kernel on this machine (see the tests above for why)")
    shim = ctypes.CDLL(str(_blas_shim.shim()))
    rng = np.random.default_rng(9)
    m, n, k = 150, 1100, 90
    for ta, tb in ((False, False), (True, False), (True, True), (False, True)):
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        c0 = rng.standard_normal((m, n), dtype=np.float32)
        results = []
        for threads in (1, 2, 3):
            c = c0.copy()
            if _split_product(shim, a, b, c, threads, ta, tb, alpha=0.5, beta=2.0) is None:
                pytest.skip("this shim was built without its kernel and pool")
            results.append(c)
        op_a = (a.T if ta else a).astype(np.float64)
        op_b = (b.T if tb else b).astype(np.float64)
        exact = 0.5 * op_a @ op_b + 2.0 * c0
        scale = 0.5 * np.abs(op_a) @ np.abs(op_b) + 2.0 * np.abs(c0)
        assert np.all(np.abs(results[0] - exact) <= 1e-6 * k * scale), (ta, tb)
        assert all(np.array_equal(results[0], r) for r in results[1:]), (ta, tb)
    a = rng.standard_normal((300, 200), dtype=np.float32)
    b = rng.standard_normal((200, 700), dtype=np.float32)
    got = np.array(mx.array(a) @ mx.array(b))
    assert np.allclose(got, a.astype(np.float64) @ b.astype(np.float64), atol=1e-3)
    got = np.array(mx.array(b).T @ mx.array(a).T)
    assert np.allclose(got, (a.astype(np.float64) @ b.astype(np.float64)).T, atol=1e-3)


FORK_PROBE = (
    "import ctypes, json, os, threading, dflash2_mlx, numpy as np\n"
    "from dflash2_mlx import _blas, _blas_shim\n"
    "info = _blas.info(); level = {'avx2': 1, 'avx512': 2}[info.kernel]\n"
    "shim = ctypes.CDLL(str(_blas_shim.shim())); ptr = ctypes.POINTER(ctypes.c_float)\n"
    "shim.dflash2_pool_helper_chunks.restype = ctypes.c_long\n"
    "a = np.ones((4, 576), np.float32); w = np.ones((8192, 576), np.float32)\n"
    "def product():\n"
    "    c = np.zeros((4, 8192), np.float32)\n"
    "    shim.dflash2_skinny_sgemm(level, 2, 4, 8192, 576, a.ctypes.data_as(ptr), 576,\n"
    "                              w.ctypes.data_as(ptr), 576, c.ctypes.data_as(ptr), 8192)\n"
    "    return bool(np.all(c == 576))\n"
    "stop = threading.Event(); right = []\n"
    "def busy():\n"  # products in flight (the pool's lock held) while the process forks
    "    while not stop.is_set(): right.append(product())\n"
    "t = threading.Thread(target=busy, daemon=True); t.start()\n"
    "while len(right) < 5: pass\n"
    "children = []\n"
    "for _ in range(3):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        before = shim.dflash2_pool_helper_chunks(); ok = True\n"
    "        for i in range(2000):\n"  # a helper on a busy machine may take a while to run
    "            ok = product() and ok\n"
    "            if i >= 40 and shim.dflash2_pool_helper_chunks() > before: break\n"
    "        helped = shim.dflash2_pool_helper_chunks() > before\n"
    "        os._exit(0 if ok and helped else 3 if ok else 4)\n"
    "    children.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    "stop.set(); t.join()\n"
    "print(json.dumps({'parent': all(right), 'children': children}))\n"
)


@pytest.mark.skipif(not LINUX_X86, reason="the few-row kernel is x86-64 code in the Linux shim")
def test_a_forked_child_gets_a_pool_of_its_own():
    """A process that forks while another thread's product holds the pool (a DataLoader, a
    server's worker): the child, which has none of the parent's helper threads and a copy of
    a held lock, gets every product right and starts helpers of its own (exit code 3: right
    but alone; 4: wrong)."""
    from dflash2_mlx import _blas

    if _blas.info().kernel is None:
        pytest.skip("no kernel on this machine (see the test above for why)")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a helper may never run before the caller has taken every chunk")
    out, _ = probe({"DFLASH2_BLAS": "auto", "DFLASH2_BLAS_THREADS": "1"}, FORK_PROBE)
    assert out == {"parent": True, "children": [0, 0, 0]}, out


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding only acts on Linux")
def test_an_openblas_without_cblas_names_leaves_mlx_on_its_own_blas(tmp_path):
    """A library named libopenblas without cblas_sgemm (an ILP64 build's names end in 64_):
    bind gives up on it. The shim used to be global by then with nothing to forward to, so
    the first matrix product jumped to address 0."""
    import ctypes.util

    libm = ctypes.util.find_library("m")
    fake_bin, fake_py = tmp_path / "bin", tmp_path / "py"
    fake_bin.mkdir(), fake_py.mkdir()
    ldconfig = fake_bin / "ldconfig"
    ldconfig.write_text(f'#!/bin/sh\necho "\tlibopenblas64.so.0 (libc6,x86-64) => {libm}"\n')
    ldconfig.chmod(0o755)
    (fake_py / "scipy_openblas32.py").write_text("raise ImportError('hidden by the test')\n")
    code = (
        "import json, dflash2_mlx, mlx.core as mx\n"
        "a = mx.ones((4, 64)); w = mx.ones((32, 64))\n"
        "print(json.dumps({'blas': dflash2_mlx._blas.info().route,\n"
        "                  'sum': float((a @ w.T).sum())}))\n"
    )
    env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "PYTHONPATH": str(fake_py)}
    env["DFLASH2_HOME"] = str(tmp_path / "home")
    got, err = probe(env, code)
    assert got == {"blas": "stock", "sum": 4 * 32 * 64.0}, (got, err)
    assert "undefined symbol" in err, err  # the warning says why


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding only acts on Linux")
def test_a_compiler_that_cannot_build_the_kernel_still_gets_openblas(tmp_path):
    """The kernel needs a compiler with AVX-512 intrinsics; where the shim does not compile
    with them, it is built to forward only (OpenBLAS alone), not dropped for the 4x slower
    reference BLAS."""
    import shutil
    import sysconfig

    real_cc = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or "cc"
    cc = tmp_path / "old-cc"
    cc.write_text(
        '#!/bin/sh\ncase "$*" in *-DDFLASH2_FORWARD_ONLY*) ;; *) exit 1 ;; esac\n'
        f'exec {real_cc} "$@"\n'
    )
    cc.chmod(0o755)
    env = {"CC": str(cc), "DFLASH2_HOME": str(tmp_path / "home"), "DFLASH2_BLAS_THREADS": "1"}
    got, err = probe(env, KERNEL_PROBE)
    assert got["kernel"] is None and got["worst"] < 1e-2, (got, err)
    fast, err = probe({**env, "DFLASH2_BLAS": "auto"})
    assert fast["blas"] in ("system-openblas", "scipy-openblas"), (fast, err)


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS binding only acts on Linux")
def test_cc_is_taken_whole_and_a_missing_compiler_is_named_with_a_remedy(tmp_path):
    """CC="ccache gcc" (a wrapper, then the compiler) builds the kernel: only the first word
    was kept. Without a compiler the warning says what to install."""
    import shutil
    import sysconfig

    real_cc = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or "cc"
    run = {"DFLASH2_BLAS_THREADS": "1", "DFLASH2_BLAS": "auto"}
    plain, err = probe({**run, "DFLASH2_HOME": str(tmp_path / "a"), "CC": real_cc}, KERNEL_PROBE)
    wrapped, err = probe(
        {**run, "DFLASH2_HOME": str(tmp_path / "b"), "CC": f"env {real_cc}"}, KERNEL_PROBE
    )
    assert wrapped["kernel"] == plain["kernel"] and wrapped["worst"] < 1e-2, (wrapped, err)
    got, err = probe({**run, "DFLASH2_HOME": str(tmp_path / "c"), "CC": str(tmp_path / "no-cc")})
    if got["blas"] == "stock":  # no system OpenBLAS to fall back on: the shim was needed
        assert "install a C compiler" in err, err


SHIM_PROBE = (
    "import json, dflash2_mlx\n"
    "from dflash2_mlx import _blas\n"
    "info = _blas.info()\n"
    "print(json.dumps({'route': info.route, 'kernel': info.kernel, 'note': info.note}))\n"
)


def _fresh_shim() -> "Path":
    """A shim built into the cache root DFLASH2_HOME names (skips where none can be built)."""
    from dflash2_mlx import _blas_shim

    try:
        return _blas_shim.shim()
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"the BLAS shim cannot be built here: {exc}")


@pytest.mark.skipif(not LINUX_X86, reason="the shim is built and bound on Linux")
def test_a_damaged_shim_is_built_again_instead_of_crashing_or_slowing_every_command(
    tmp_path, monkeypatch
):
    """A shim cut short or with a zeroed tail (an interrupted copy, a crash before the disk
    had it) made every command, `--version` too, die of SIGBUS or SIGSEGV when loaded;
    garbage or another library in its place left MLX on the slow reference BLAS for good. A
    shim is named after its bytes' hash: a damaged one is deleted and built again."""
    import _ctypes
    import shutil

    monkeypatch.setenv("DFLASH2_HOME", str(tmp_path))
    shim = _fresh_shim()
    whole = shim.read_bytes()
    want, _ = probe({"DFLASH2_HOME": str(tmp_path)}, SHIM_PROBE)
    for damage in ("truncated", "zeroed tail", "garbage", "another library"):
        if damage == "truncated":
            shim.write_bytes(whole[:5000])
        elif damage == "zeroed tail":
            shim.write_bytes(whole[:5000] + bytes(len(whole) - 5000))
        elif damage == "garbage":
            shim.write_bytes(b"not a library\n" * 100)
        else:
            shutil.copy(_ctypes.__file__, shim)
        got, err = probe({"DFLASH2_HOME": str(tmp_path)}, SHIM_PROBE)
        assert got == want, (damage, got, err)
        assert "reference BLAS" not in err, (damage, err)
        assert [p.read_bytes() for p in shim.parent.glob("*.so")] == [whole], damage


def _counting_compiler(tmp_path, full_build_says: str) -> tuple[dict, "Path"]:
    """An environment whose CC logs each call and fails the shim's full build (the one
    without -DDFLASH2_FORWARD_ONLY) saying `full_build_says`; the forward-only one compiles."""
    tmp_path.mkdir(exist_ok=True)
    log = tmp_path / "cc.log"
    cc = tmp_path / "cc"
    cc.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        'case "$*" in *FORWARD_ONLY*) exec cc "$@";; esac\n'
        f'echo "{full_build_says}" >&2\n'
        "exit 1\n"
    )
    cc.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "DFLASH2_HOME": str(tmp_path / "home"), "CC": str(cc)}
    env |= {"TMPDIR": str(tmp_path / "tmp"), "DFLASH2_BLAS": "stock"}
    return env, log


@pytest.mark.skipif(not LINUX_X86, reason="the shim is built and bound on Linux")
def test_no_room_to_build_the_shim_leaves_no_lesser_shim_behind(tmp_path):
    """A full disk failed the shim's build, whose retry for compilers without the kernel's
    intrinsics (smaller) then fitted: the forward-only shim stayed for good, plain decoding
    about 2x slower. A build that fails for want of room is refused (the cache, then a
    private folder: two tries a start), and nothing is left; a compiler that lacks the
    intrinsics still gets the forward-only shim."""
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) here")
    code = (
        "from dflash2_mlx import _blas_shim\n"
        "try:\n"
        "    print(_blas_shim.shim())\n"
        "except (OSError, RuntimeError) as e:\n"
        "    print('refused:', e)\n"
    )
    env, log = _counting_compiler(tmp_path, "cc1: fatal error: No space left on device")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:") and "no space left" in out.stdout, out.stdout
    assert not list(tmp_path.rglob("*.so")), list(tmp_path.rglob("*"))
    assert len(log.read_text().splitlines()) == 2  # the cache, then the private folder
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".c", ".tmp")]
    env, log = _counting_compiler(tmp_path / "old", "error: unknown type name '__m512'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip().endswith(".so"), out.stdout  # the forward-only shim


def test_of_two_whole_shims_the_full_build_is_taken_and_a_damaged_one_deleted(tmp_path):
    """Two builds at once may leave two shims (a full one and a forward-only one, by hash
    order the forward-only one came first, and no kernel ran)."""
    import hashlib

    from dflash2_mlx import _blas_shim

    key = "0123456789abcdef"

    def shim(data: bytes):
        path = tmp_path / f"cblas_shim_{key}_{hashlib.sha256(data).hexdigest()[:16]}.so"
        path.write_bytes(data)
        return path

    small, large = shim(b"\0" * 10), shim(b"\1" * 20)
    damaged = shim(b"\2" * 5)
    damaged.write_bytes(b"\3" * 5)
    assert _blas_shim._found(tmp_path, key) == large
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([small.name, large.name])
