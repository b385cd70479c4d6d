"""The measurement scripts (docs/results/scripts) and the data tools (tools/) use only names the
package still has: a name moved between modules (load_pair to loader.py) once left ten scripts
that no longer ran, which nothing but running them would have shown. Checked: every
`from <project module> import name`, every `import <project module>`, and every `alias.name`
read off a project module the script imported under that alias."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("docs/results/scripts/*.py"), *ROOT.glob("tools/*.py")])
PACKAGES = ("dflash2_mlx", "dflash2_cli")


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def project_names(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) of each project name the script imports or reads off a
    project module it imported (`B.environment()` after `from dflash2_mlx import bench as B`)."""
    tree = ast.parse(path.read_text())
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _ours(node.module):
                for a in node.names:
                    found.append((node.lineno, node.module, a.name))
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name):
                    found.append((node.lineno, a.name, None))
                    key = a.asname or a.name.split(".")[0]  # `import a.b` binds `a`
                    aliases[key] = a.name if a.asname else key
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is not None and _is_module(module):
                found.append((node.lineno, module, node.attr))
    return found


def _is_module(dotted: str) -> bool:
    try:
        importlib.import_module(dotted)
        return True
    except ImportError:
        return False


def resolves(module: str, name: str | None) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return name is None or hasattr(mod, name) or _is_module(f"{module}.{name}")


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) > 20 and any(project_names(p) for p in SCRIPTS)


def test_a_moved_name_is_found_however_it_is_read(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from dflash2_mlx import bench as B\nfrom dflash2_mlx.bench import nosuch\n"
        "import dflash2_mlx.nomodule\nB.environment()\nB.run_bench\n"
    )
    missing = [(m, n) for _, m, n in project_names(bad) if not resolves(m, n)]
    assert missing == [
        ("dflash2_mlx.bench", "nosuch"),
        ("dflash2_mlx.nomodule", None),
        ("dflash2_mlx.bench", "environment"),
    ]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_project_name_a_script_uses_exists(path):
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {module}{'.' + name if name else ''}"
        for line, module, name in project_names(path)
        if not resolves(module, name)
    ]
    assert not missing, "\n".join(missing)
