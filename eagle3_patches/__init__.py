"""eagle3-patches: make EAGLE-3 speculative decoding work, and keep working, for
Kimi-K2.5 and other DeepSeek-V3-family targets on stock SGLang.

``import eagle3_patches`` is cheap: it never imports sglang or torch.  Patches land
when their sglang module is imported (post-import hooks).

    import eagle3_patches
    eagle3_patches.apply()          # every default patch, lazily
    eagle3_patches.status()         # name -> PatchStatus
    eagle3_patches.revert()         # restore every original
"""

from __future__ import annotations

from typing import Iterable

from .errors import Eagle3CaptureError, Eagle3ConfigError, Eagle3Error, Eagle3TargetError, PatchError
from .registry import PatchStatus, Registry, State

__version__ = "0.1.0"

_registry: Registry | None = None


def get_registry() -> Registry:
    """The production EAGLE-3 patch set (built on first use)."""
    global _registry
    if _registry is None:
        from .patches import build_registry

        _registry = build_registry()
    return _registry


def apply(names: Iterable[str] | None = None) -> dict[str, PatchStatus]:
    """Apply the default patches (or the named ones); honours ``EAGLE3_PATCHES_DISABLE``."""
    return get_registry().apply(names)


def revert(names: Iterable[str] | None = None) -> dict[str, PatchStatus]:
    """Restore every original changed by the given (default: all) patches."""
    return get_registry().revert(names)


def status() -> dict[str, PatchStatus]:
    return get_registry().status()


__all__ = [
    "apply",
    "revert",
    "status",
    "get_registry",
    "PatchStatus",
    "State",
    "Eagle3Error",
    "Eagle3ConfigError",
    "Eagle3TargetError",
    "Eagle3CaptureError",
    "PatchError",
    "__version__",
]
