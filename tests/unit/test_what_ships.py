"""The wheel ships the test harness that ``eagle3-patches selftest`` runs (``eagle3_patches/testing``) and nothing the
repository's tests alone use: those live in ``tests/support``.  A module of ``eagle3_patches/testing`` ships only if
the rest of the library reaches it: imports it, through other modules it reaches, or names it in a string (a module
run with ``-m``, a forkserver preload, a file copied into a tiny checkpoint)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "eagle3_patches"
TESTING = "eagle3_patches.testing"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def named(module: str, text: str) -> bool:
    """``text`` ends with the module's name as a dotted name, a path or a file name (``.preload``,
    ``eagle3_patches.testing.text_only_launch``, ``tiny_kimi_k25_processor.py``)."""
    return re.search(rf"(^|[./]){module}(\.py)?$", text) is not None


def references(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the package that ``name`` imports, and those of eagle3_patches/testing it names in a string."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    harness = [m for m in known if m.startswith(TESTING + ".")]
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    found = {m for m in harness if any(named(m.rsplit(".", 1)[1], text) for text in strings)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return {m for m in found if m in known}


def reached() -> set[str]:
    known = modules()
    graph = {name: references(name, path, known) for name, path in known.items()}
    seen: set[str] = set()
    todo = [m for m in known if not m.startswith(TESTING)]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def test_every_shipped_test_harness_module_is_one_the_library_runs():
    shipped = {m for m in modules() if m.startswith(TESTING + ".")}
    assert sorted(shipped - reached()) == [], "move what only the tests use to tests/support"


def test_the_check_sees_a_module_only_the_tests_use(tmp_path, monkeypatch):
    """The check itself: a harness module nothing in the library reaches is named."""
    import shutil

    copy = tmp_path / "eagle3_patches"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "data", "*.safetensors"))
    (copy / "testing" / "only_for_the_tests.py").write_text('"""Nothing imports this."""\n')
    monkeypatch.setattr(__import__(__name__), "PACKAGE", copy)
    assert sorted({m for m in modules() if m.startswith(TESTING + ".")} - reached()) == [
        "eagle3_patches.testing.only_for_the_tests"
    ]
