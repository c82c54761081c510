"""Installed as the package ``eagle3_patches.docs`` (package data: the ``*.md`` pages).

This directory stays the only copy of the docs; ``pyproject.toml`` maps it into the wheel so
``eagle3-patches docs [PAGE]`` prints the shipped page in every install layout.
"""
