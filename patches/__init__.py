"""Installed as the package ``eagle3_patches.series`` (package data: the series directories).

This directory stays the only copy of the fork-path diffs; ``pyproject.toml`` maps it into the
wheel so ``eagle3_patches.fork`` finds it with ``importlib.resources`` in every install layout.
"""
