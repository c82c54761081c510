#!/usr/bin/env python3
"""Figures on the package's shape (maintainers): lines per layer, imports of its own modules made inside
functions, the modules over the size docs/architecture.md allows.

    python tools/architecture_stats.py                      # this checkout
    python tools/architecture_stats.py --root /tmp/old      # another checkout, read with this checkout's layers

The layers are the import-linter `layers` contract of pyproject.toml (docs/architecture.md); a module of another
checkout is counted in the layer its top-level name has here (a module no layer names is listed as such).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "eagle3_patches"
#: a library module longer than this needs a stated reason (docs/architecture.md)
MAX_LINES = 600
#: that reason: the module's first line, a comment (before the docstring: a patch's docstring is its documentation)
LONG_REASON = re.compile(r"# long module: \S")


def layers(config: Path) -> list[list[str]]:
    """The top-to-bottom layers of the `layers` contract, each a list of the names in it."""
    data = tomllib.loads(config.read_text(encoding="utf-8"))
    contract = next(c for c in data["tool"]["importlinter"]["contracts"] if c.get("type") == "layers")
    return [re.split(r"\s*[|:]\s*", layer.strip()) for layer in contract["layers"]]


def in_function_imports(tree: ast.AST) -> int:
    """Imports of this package's own modules made inside a function body."""
    count = 0
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGE)):
                count += 1
            elif isinstance(node, ast.Import) and any(a.name.startswith(PACKAGE) for a in node.names):
                count += 1
    return count


def stats(root: Path, config: Path) -> dict:
    names = layers(config)
    by_layer: dict[str, int] = {" | ".join(layer): 0 for layer in names}
    unlayered: dict[str, int] = {}
    imports = 0
    large: list[tuple[str, int]] = []
    unexplained: list[str] = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root / PACKAGE)
        text = path.read_text(encoding="utf-8")
        n = len(text.splitlines())
        imports += in_function_imports(ast.parse(text))
        if n > MAX_LINES:
            large.append((str(rel), n))
            if not LONG_REASON.match(text):
                unexplained.append(str(rel))
        top = rel.parts[0].removesuffix(".py")
        layer = next((" | ".join(layer) for layer in names if top in layer), None)
        if layer is None:
            unlayered[top] = unlayered.get(top, 0) + n
        else:
            by_layer[layer] += n
    return {
        "by_layer": by_layer,
        "unlayered": unlayered,
        "in_function_imports": imports,
        "large": large,
        "unexplained": unexplained,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    args = ap.parse_args(argv)
    s = stats(args.root, ROOT / "pyproject.toml")
    print(f"lines per layer ({args.root}), top to bottom:")
    for layer, n in s["by_layer"].items():
        print(f"  {n:6d}  {layer}")
    for top, n in sorted(s["unlayered"].items()):
        print(f"  {n:6d}  {top} (in no layer)")
    print(f"imports of {PACKAGE}'s own modules inside functions: {s['in_function_imports']}")
    print(f"modules over {MAX_LINES} lines: " + (", ".join(f"{m} ({n})" for m, n in s["large"]) or "none"))
    if s["unexplained"]:
        print(f"  without `# long module: <why>` as their first line: {', '.join(s['unexplained'])}")
    return 1 if s["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(main())
