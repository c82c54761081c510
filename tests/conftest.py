"""Shared fixtures: tiny checkpoints built once per session (deterministic, no hub)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eagle3_patches.testing import tiny_models


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """Where the tiny checkpoints live; EAGLE3_TINY_CACHE reuses them across runs."""
    cached = os.environ.get("EAGLE3_TINY_CACHE")
    return Path(cached) if cached else tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny(tiny_root) -> dict[str, Path]:
    """Paths of the tiny DeepSeek-V3 / Kimi-K2.5 targets and EAGLE-3 drafts (see tiny_models.build_all)."""
    return tiny_models.build_all(tiny_root)
