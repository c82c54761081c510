"""Opt-in instruments: diagnostics that ride on sglang's EAGLE-3 path but fix nothing.

``eagle3_probe`` (what flows through each hop, ``EAGLE3_PATCHES_PROBE``) and ``hidden_state_dump``
(served aux states as draft training data, ``EAGLE3_PATCHES_DUMP_DIR``).  They have a registry of
their own, with the patches' mechanics (lazy landing, originals kept, exact revert); each one is
switched on by its own setting (:meth:`~eagle3_patches.registry.Patch.enabled_by`), never by default.
"""

from __future__ import annotations

from ..registry import Registry, discover


def build_registry() -> Registry:
    return Registry("instrument", discover(__name__))
