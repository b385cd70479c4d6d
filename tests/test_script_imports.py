"""The measurement scripts (docs/results/scripts) and the data tools (tools/) import only names
the package still has: a name moved between modules (load_pair to loader.py) once left ten
scripts that no longer ran, which nothing but running them would have shown."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("docs/results/scripts/*.py"), *ROOT.glob("tools/*.py")])
PACKAGES = ("dflash2_mlx", "dflash2_cli")


def project_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) of each absolute import of the project's packages."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in PACKAGES:
                found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] in PACKAGES
            ]
    return found


def resolves(module: str, name: str | None) -> bool:
    mod = importlib.import_module(module)
    if name is None or hasattr(mod, name):
        return True
    try:  # a submodule: `from dflash2_mlx import bench`
        importlib.import_module(f"{module}.{name}")
        return True
    except ImportError:
        return False


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) > 20 and any(project_imports(p) for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_project_name_a_script_imports_exists(path):
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {module}{'.' + name if name else ''}"
        for line, module, name in project_imports(path)
        if not resolves(module, name)
    ]
    assert not missing, "\n".join(missing)
