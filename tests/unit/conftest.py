"""Fixtures of the unit tests."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture(scope="session")
def tool():
    """``tool("matrix")``: the maintainer script ``tools/matrix.py`` as a module.  ``tools/`` is on ``sys.path``
    only while it imports, as when the script runs (the scripts import each other by name)."""

    def load(name: str):
        sys.path.insert(0, str(TOOLS))
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(str(TOOLS))

    return load
