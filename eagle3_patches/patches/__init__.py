"""The EAGLE-3 patch set: one module per sglang bug, each defining ``PATCH``.

The modules are found by listing this package (a new patch is a new module; docs/patches.md has the
checklist); ``PATCH.order`` sets the order they apply in, which the fork-path series follows.
:func:`get_registry` is the process's one registry of them (``eagle3_patches.get_registry()`` is the same
object); a patch that needs the others' state asks it here, never the package above.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..registry import Patch, Registry, Saver, discover, expect_attr
from ..sglang_runtime import after_resolution, server_args_resolution_method

_registry: Registry | None = None


class LauncherCheck(Patch):
    """A patch that judges the flags once ``ServerArgs`` resolved them, in the launcher, before any rank exists:
    :meth:`launcher_check` raises for a setup it refuses (``remedy = "refused"``)."""

    module = "sglang.srt.server_args"
    remedy = "refused"

    def launcher_check(self, server_args: Any) -> None:
        raise NotImplementedError

    def check(self, module: ModuleType) -> None:
        expect_attr(module.ServerArgs, server_args_resolution_method(module.ServerArgs))

    def patch(self, module: ModuleType, saver: Saver) -> None:
        method = server_args_resolution_method(module.ServerArgs)
        saver.wrap(module.ServerArgs, method, after_resolution(self.launcher_check))


def get_registry() -> Registry:
    """The production EAGLE-3 patch set (built on first use)."""
    global _registry
    if _registry is None:
        _registry = Registry("eagle3", discover(__name__))
    return _registry
