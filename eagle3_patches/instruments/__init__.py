"""Instruments: diagnostics that ride on sglang's EAGLE-3 path but fix nothing.

``accept_watchdog`` (on by default, ``EAGLE3_PATCHES_WATCHDOG``: warns when drafts are essentially never
accepted and runs the probe once to say why), ``eagle3_probe`` (opt-in: what flows through each hop,
``EAGLE3_PATCHES_PROBE``) and ``hidden_state_dump`` (opt-in: served aux states as draft training data,
``EAGLE3_PATCHES_DUMP_DIR``).  They have a registry of their own, with the patches' mechanics (lazy
landing, originals kept, exact revert), and are not in the fork series; each one is switched on or off by
its own setting (:meth:`~eagle3_patches.registry.Patch.enabled_by`).
"""

from __future__ import annotations

from ..registry import Registry, discover


def build_registry() -> Registry:
    return Registry("instrument", discover(__name__))
