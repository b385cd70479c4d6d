"""Shared test setup: the BLAS binding before MLX loads, the markers, and the fixtures that
several test files use."""

import os
import sys
from pathlib import Path

import pytest

import dflash2_mlx  # binds the optimized BLAS before MLX loads

sys.path.insert(0, str(Path(__file__).parent))

from harness import runner  # noqa: E402  (test helpers: need the path above)
from kernel_exec import require_metal  # noqa: E402
from tiny_pair import save_pair  # noqa: E402

from dflash2_mlx import kernels  # noqa: E402

MARKERS = {
    "slow": "takes seconds to minutes (real model, training, a terminal or a server)",
    "network": "needs the package index (skips with the reason when it cannot be reached)",
    "real_model": "runs the embedded SmolLM2 (converted once into the dflash2 cache)",
}


def pytest_configure(config):
    for name, what in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """The work units of pytest-xdist's `--dist loadgroup` (pyproject's addopts): a module runs
    whole on one worker, so its module-scoped models and servers are built once, and the tests of
    the embedded SmolLM2 (`real_model`) share one worker, so it is converted at most once. That
    unit is the longest: on a worker it goes first, so that the others fill the other worker."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            real = item.get_closest_marker("real_model") is not None
            item.add_marker(
                pytest.mark.xdist_group("smollm2" if real else item.nodeid.split("::")[0])
            )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("real_model") is None)  # stable


def pytest_report_header(config):
    """Which BLAS (and which OpenBLAS kernel set) the CPU matmuls of this run use."""
    blas = dflash2_mlx._blas.info()
    core = f", kernels {blas.core}" if blas.core else ""
    threads = f", {blas.threads} thread(s)" if blas.threads else ""
    kernel = f", few-row kernel {blas.kernel}" if blas.kernel else ""
    return f"dflash2 BLAS: {blas.route}{core}{threads}{kernel}"


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """(target folder, drafter folder) of a tiny random pair saved to disk; read-only."""
    return save_pair(tmp_path_factory.mktemp("tiny_pair"))


@pytest.fixture
def steady_timings(monkeypatch):
    """Autotune runs on tiny models time forwards of a few ms: on a loaded machine one hiccup
    makes its plausibility check (costs.check_plausible, tested on its own) refuse them. Tests
    that need a profile, not that check, leave it out."""
    from dflash2_mlx import costs

    monkeypatch.setattr(costs, "check_plausible", lambda verify_ms: None)


@pytest.fixture
def dflash2_home(tmp_path, monkeypatch) -> Path:
    """A private dflash2 cache root (autotune profiles, the BLAS shim) for one test."""
    home = tmp_path / "home"
    monkeypatch.setenv("DFLASH2_HOME", str(home))
    return home


@pytest.fixture
def hf_offline(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache in offline mode: Hub code runs, the network is never used."""
    from huggingface_hub import constants

    cache = tmp_path / "hf"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


# The kernel tests' executors (kernel_exec.py says what they are).
@pytest.fixture(scope="session")
def harness(tmp_path_factory):
    if runner.find_compiler() is None:
        pytest.skip("no C++ compiler (g++, c++, clang++ or $CXX): CPU kernel harness not run")
    return runner.CpuMetal(tmp_path_factory.getbasetemp() / "metal_harness")


def _harness_exec(cpu):
    return lambda launch: cpu.run_launch(launch, kernels.kernel_source(launch.spec.file))


def _metal_exec(launch):
    return kernels.execute(launch)  # lazy: also usable inside mx.grad (see kernels_via)


@pytest.fixture(params=["harness", "metal"])
def run_kernel(request):
    if request.param == "metal":
        require_metal()
        return _metal_exec
    return _harness_exec(request.getfixturevalue("harness"))
