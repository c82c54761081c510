"""The repository's top-level directories that the wheel ships as package data.

``pyproject.toml`` maps ``patches/`` (the fork-path diffs) onto the package
``eagle3_patches.series`` and ``docs/`` onto ``eagle3_patches.docs``: one copy in git, and in
an install they sit inside the ``eagle3_patches`` package, found with ``importlib.resources``
whatever the layout (a venv, ``pip install --user``, ``--target DIR``, a system pip's
``/usr/local``, an editable install).  In a source checkout used without installing
(``PYTHONPATH``, ``tools/*.py``) the top-level directory next to the running package is used,
so a checkout never reads another install's copy.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

SERIES_PACKAGE = "eagle3_patches.series"
DOCS_PACKAGE = "eagle3_patches.docs"
#: package -> its directory at the top of a source checkout
TOP_LEVEL = {SERIES_PACKAGE: "patches", DOCS_PACKAGE: "docs"}

_CHECKOUT = Path(__file__).resolve().parent.parent


def shipped_dir(package: str) -> Path | None:
    """The directory holding ``package``'s data, or None when this install lacks it."""
    source = _CHECKOUT / TOP_LEVEL[package]
    if (_CHECKOUT / "pyproject.toml").is_file() and (source / "__init__.py").is_file():
        return source
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        return None
    # pip installs wheels unpacked, so this is a directory (a zip import would give a zipfile.Path)
    return root if isinstance(root, Path) and root.is_dir() else None


def doc_pointer(page: str) -> str:
    """How to read a docs page from a checkout and from an install."""
    return f"docs/{page}.md (installed: eagle3-patches docs {page})"
