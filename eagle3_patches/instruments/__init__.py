"""Instruments: diagnostics that ride on sglang's EAGLE-3 path but fix nothing.

``accept_watchdog`` (on by default, ``EAGLE3_PATCHES_WATCHDOG``: warns when drafts are essentially never
accepted and runs the probe once to say why), ``eagle3_probe`` (opt-in: what flows through each hop,
``EAGLE3_PATCHES_PROBE``) and ``hidden_state_dump`` (opt-in: served aux states as draft training data,
``EAGLE3_PATCHES_DUMP_DIR``).  They have a registry of their own, with the patches' mechanics (lazy
landing, originals kept, exact revert), and are not in the fork series; each one is switched on or off by
its own setting (:meth:`~eagle3_patches.registry.Patch.enabled_by`).

:func:`get_registry` is the process's one registry of them (``eagle3_patches.get_instruments()``).  Instruments
sit above the patches: they may read the patch set's state (:mod:`eagle3_patches.patches`), never the reverse.
"""

from __future__ import annotations

from ..registry import Registry, discover

_registry: Registry | None = None


def get_registry() -> Registry:
    """The instruments' registry (built on first use)."""
    global _registry
    if _registry is None:
        _registry = Registry("instrument", discover(__name__))
    return _registry
