"""The EAGLE-3 patch set: one module per sglang bug, each defining ``PATCH``.

The modules are found by listing this package (a new patch is a new module, nothing else to
edit); ``PATCH.order`` sets the order they apply in, which the fork-path series follows.
"""

from __future__ import annotations

from ..registry import Registry, discover


def build_registry() -> Registry:
    return Registry("eagle3", discover(__name__))
