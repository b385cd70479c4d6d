"""Packaging: `import dflash2_mlx` stays light, the BLAS is bound before MLX loads, the package
list in pyproject.toml matches the tree, the version is written once, and a built wheel ships
the kernel sources, the embedded drafter and the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from offline import require_pypi

ROOT = Path(__file__).resolve().parents[1]
SERVER_AND_PLOTS = ("fastapi", "uvicorn", "matplotlib")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def _loaded(prefixes) -> str:
    return f"sorted(m for m in sys.modules if m.split('.')[0] in {tuple(prefixes)!r})"


def test_importing_the_library_loads_no_model_code_and_no_server():
    code = (
        "import sys\n"
        "import dflash2_mlx\n"
        f"assert not {_loaded(('mlx', 'mlx_lm', 'numpy') + SERVER_AND_PLOTS)}, "
        f"{_loaded(('mlx', 'mlx_lm', 'numpy') + SERVER_AND_PLOTS)}\n"
        "from dflash2_mlx import Pair, SpeculativeDecoder, load_pair, doctor\n"
        "assert 'mlx.core' in sys.modules\n"
        f"assert not {_loaded(SERVER_AND_PLOTS)}, {_loaded(SERVER_AND_PLOTS)}\n"
        "print('light')\n"
    )
    assert _run(code) == "light"


def test_blas_is_bound_before_mlx_loads_whatever_is_imported_first():
    """Any module of the package runs dflash2_mlx/__init__ first, which binds the BLAS."""
    code = (
        "import sys\n"
        "import dflash2_mlx.kernels._references\n"
        "from dflash2_mlx import _blas\n"
        "assert _blas._INFO is not None and 'after mlx.core' not in _blas._INFO.note, _blas._INFO\n"
        "print('bound first')\n"
    )
    assert _run(code) == "bound first"


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS uses Accelerate, not OpenBLAS")
def test_blas_threads_are_dflash2s_setting_and_reported_as_openblas_runs_them(monkeypatch):
    """DFLASH2_BLAS_THREADS wins over an OPENBLAS_NUM_THREADS already set, a bad value is
    warned about, and the count reported is the one OpenBLAS runs (it caps what it is asked
    for at the cores it sees), as the autotune profile's key and the bench record it."""
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "import dflash2_mlx\n"
        "from dflash2_mlx import _blas\n"
        "print(_blas.info().threads if _blas.info().optimized else 'stock')\n"
    )
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setenv("DFLASH2_BLAS_THREADS", "1")
    got = _run(code)
    if got == "stock":
        pytest.skip("no OpenBLAS on this machine (the reference BLAS has no threads)")
    assert got == "1"
    monkeypatch.setenv("DFLASH2_BLAS_THREADS", "4096")
    assert 1 <= int(_run(code)) <= (os.cpu_count() or 1)
    monkeypatch.setenv("DFLASH2_BLAS_THREADS", "abc")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "DFLASH2_BLAS_THREADS='abc' is not a count" in out.stderr


def test_unknown_names_are_attribute_errors():
    import dflash2_mlx

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dflash2_mlx.nope
    assert set(dflash2_mlx.__all__) <= set(dir(dflash2_mlx))


def test_type_checkers_see_every_public_name_where_it_loads():
    """The lazily loaded names are imported under TYPE_CHECKING too (else mypy and editors see
    `Any` through `import dflash2_mlx`), each from the module __getattr__ loads it from."""
    import ast

    import dflash2_mlx

    tree = ast.parse((ROOT / "dflash2_mlx" / "__init__.py").read_text())
    (block,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    typed = {a.name: n.module for n in block.body for a in n.names}
    assert typed == dflash2_mlx._EXPORTS


def test_the_package_list_matches_the_tree():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = cfg["package-dir"]
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "dflash2_mlx").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    found |= {name for name, folder in mapped.items() if (ROOT / folder / "__init__.py").is_file()}
    assets = ROOT / "dflash2_mlx" / "assets"  # data folders, listed too (setuptools ships them)
    found |= {"dflash2_mlx.assets"} | {f"dflash2_mlx.assets.{p.name}" for p in assets.iterdir()}
    assert sorted(cfg["packages"]) == sorted(found)


def test_the_version_is_written_once():
    from importlib.metadata import version

    import dflash2_mlx

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert version("dflash2") == dflash2_mlx.__version__


@pytest.mark.slow
@pytest.mark.network
def test_a_built_wheel_ships_kernels_assets_and_the_cli(tmp_path):
    """Builds a wheel from a copy of the sources as `pip install .` does (an isolated build
    environment with the build requirements from the index) and reads its file list."""
    require_pypi("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("dflash2_mlx", "cli", "metal"):
        shutil.copytree(
            ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "-q",
        "-w",
        str(tmp_path / "dist"),
        str(src),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # a deprecated field builds today and fails once setuptools drops it (pip's own
    # deprecation notices are not ours)
    assert "SetuptoolsDeprecationWarning" not in out.stderr, out.stderr
    wheel = next((tmp_path / "dist").glob("dflash2-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for kernel in (ROOT / "metal").glob("*.metal"):
        assert f"dflash2_mlx/kernels/metal/{kernel.name}" in names, kernel.name
    drafter = "dflash2_mlx/assets/drafters/smollm2-135m-dflash2"
    for name in ("config.json", "model.safetensors", "draft_vocab.json", "datastore.npz"):
        assert f"{drafter}/{name}" in names, name
    assert "dflash2_mlx/assets/prompts/heldout.jsonl" in names
    assert "dflash2_mlx/cblas_shim.c" in names  # the Linux BLAS shim is compiled on first use
    assert "dflash2_mlx/py.typed" in names  # type checkers read the package's hints
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {
        "dflash2_cli/app.py",
        "dflash2_cli/__main__.py",
        "dflash2_mlx/kernels/_references.py",
    } <= names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "dflash2 = dflash2_cli.app:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert not any(n.startswith(("tests/", "cli/", "metal/")) for n in names)
