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


def probe(env_extra):
    env = dict(os.environ, **env_extra)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
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
