"""eagle3-patches: make EAGLE-3 speculative decoding work, and keep working, for
Kimi-K2.5 and other DeepSeek-V3-family targets on stock SGLang.

``import eagle3_patches`` is cheap: it never imports sglang or torch.  Patches land
when their sglang module is imported (post-import hooks).

    import eagle3_patches
    eagle3_patches.apply()          # every default patch (and the instruments the environment asks for), lazily
    eagle3_patches.status()         # name -> PatchStatus
    eagle3_patches.revert()         # restore every original

Two registries: the patch set (:func:`get_registry`, fixes, on by default) and the opt-in
instruments (:func:`get_instruments`: the probe and the hidden-state dump, each switched on by
its own setting).  The functions below act on both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from . import instruments, patches, settings
from .errors import (
    Eagle3CaptureError,
    Eagle3ConfigError,
    Eagle3Error,
    Eagle3TargetError,
    PatchError,
)
from .registry import PatchStatus, Registry, State
from .version import __version__

logger = logging.getLogger("eagle3_patches")


def get_registry() -> Registry:
    """The production EAGLE-3 patch set (built on first use)."""
    return patches.get_registry()


def get_instruments() -> Registry:
    """The instruments: the accept-length watchdog (on by default), the probe and the hidden-state dump (opt-in)."""
    return instruments.get_registry()


def registries() -> tuple[Registry, Registry]:
    return get_registry(), get_instruments()


def get_patch(name: str):
    """The patch or instrument called ``name`` (KeyError naming the known ones otherwise)."""
    for reg in registries():
        if name in reg:
            return reg[name]
    raise KeyError(f"eagle3-patches: unknown patch {name!r}; known patches: {', '.join(known_names())}")


def known_names() -> list[str]:
    return [n for reg in registries() for n in reg.names()]


def _split(names: Iterable[str] | None) -> list[list[str] | None]:
    """``names`` per registry (None: each registry's own default selection); unknown names raise KeyError."""
    if names is None:
        return [None, None]
    names = list(names)
    unknown = [n for n in names if n not in known_names()]
    if unknown:
        raise KeyError(f"eagle3-patches: unknown patch {unknown[0]!r}; known patches: {', '.join(known_names())}")
    patches, instruments = registries()
    return [[n for n in names if n in patches], [n for n in names if n in instruments]]


def apply(names: Iterable[str] | None = None) -> dict[str, PatchStatus]:
    """Apply the default patches (or the named ones) and the instruments the settings switch on;
    honours ``EAGLE3_PATCHES_DISABLE``.  Names no registry knows in the ``EAGLE3_PATCHES_*`` lists are
    logged as a warning."""
    for var, unknown in settings.unknown_names(known_names()).items():
        logger.warning(
            "eagle3-patches: %s names unknown patch(es) %s (ignored); known: %s",
            var,
            ", ".join(unknown),
            ", ".join(known_names()),
        )
    patch_names, instrument_names = _split(names)
    patches, instruments = registries()
    if patch_names is None or patch_names:
        patches.apply(patch_names)
    s = settings.current()
    wanted = [n for n in instruments.names() if instruments[n].enabled_by(s)]
    instruments.apply(sorted(set(wanted) | set(instrument_names or [])))
    return status()


def revert(names: Iterable[str] | None = None) -> dict[str, PatchStatus]:
    """Restore every original changed by the given (default: all) patches and instruments."""
    for reg, selected in zip(registries(), _split(names)):
        if selected != []:
            reg.revert(selected)
    return status()


def status() -> dict[str, PatchStatus]:
    """Every patch's state, then every instrument's."""
    return {n: s for reg in registries() for n, s in reg.status().items()}


__all__ = [
    "apply",
    "revert",
    "status",
    "get_registry",
    "get_instruments",
    "get_patch",
    "registries",
    "PatchStatus",
    "State",
    "Eagle3Error",
    "Eagle3ConfigError",
    "Eagle3TargetError",
    "Eagle3CaptureError",
    "PatchError",
    "__version__",
]
