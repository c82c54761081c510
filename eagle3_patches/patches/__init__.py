"""The EAGLE-3 patch set: one module per sglang bug, each defining ``PATCH``.

The modules are found by listing this package (a new patch is a new module; docs/patches.md has the
checklist); ``PATCH.order`` sets the order they apply in, which the fork-path series follows.
:func:`get_registry` is the process's one registry of them (``eagle3_patches.get_registry()`` is the same
object); a patch that needs the others' state asks it here, never the package above.
"""

from __future__ import annotations

from ..registry import Registry, discover

_registry: Registry | None = None


def get_registry() -> Registry:
    """The production EAGLE-3 patch set (built on first use)."""
    global _registry
    if _registry is None:
        _registry = Registry("eagle3", discover(__name__))
    return _registry
