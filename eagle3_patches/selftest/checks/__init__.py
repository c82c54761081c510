"""The checks, one function each: what it makes stock and patched sglang do, and what counts as the bug and
as the fix.  The repository's behavioural tests call the same functions (``tests/patches``,
``tests/selftest``), so CI proves every CPU check on every change.

One module per patch or instrument, named after it (``eagle3_fc_guard.py``), holds that patch's checks
(``CHECKS``, each ``Check(..., patch=<the module's name>)``), their functions and their helpers; ``_shared``
holds what several use; a module named after no patch holds checks of sglang itself (``patch=None``:
``sampling_lossless``).  This package finds the modules by listing itself, as the registry finds the patches, so a
new patch's check is one new module here.  :data:`CHECKS` is every module's checks in registry order (the
patches', then the instruments', then sglang's own), each module's in its own order.

Every patch has at least one check, or a reason in :data:`NO_CHECK` (``tests/selftest/test_selftest.py`` makes
sure of it).  The CPU
checks run on any machine (on a CUDA device they run on the device, with the user's attention backend and
dtype); the ``cuda`` ones need a GPU: real CUDA graphs, real quantization kernels, NCCL.
"""

from __future__ import annotations

import importlib
import pkgutil

from ...checkpoint.releases import NEWEST_CHECKED
from ..base import Check
from .eagle3_draft_strict_loading import REFUSED_FOR  # noqa: F401 - imported from here by tests/patches
from .rank_consistency import load_rank  # noqa: F401 - imported from here by tests/distributed


def _discover() -> tuple[Check, ...]:
    """``CHECKS`` of every module of this package (``_``-prefixed ones are helpers), in registry order of their
    patches (a check of no known patch last), then in each module's order."""
    import eagle3_patches

    order = {name: i for i, name in enumerate(eagle3_patches.known_names())}
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for position, check in enumerate(getattr(module, "CHECKS", ())):
            found.append(((order.get(check.patch, len(order)), info.name, position), check))
    return tuple(check for _, check in sorted(found, key=lambda item: item[0]))


CHECKS: tuple[Check, ...] = _discover()

BY_NAME = {c.name: c for c in CHECKS}

#: patches and instruments without a check of their own, and why
NO_CHECK = {
    "eagle3_probe": "an opt-in diagnostic that fixes nothing; tests/probe covers it in the repository",
    "accept_watchdog": "it reports at run time and changes nothing; tests/unit and tests/e2e cover it in the "
    "repository",
    "eagle3_draft_config_fields": "it judges the draft's config against the installed release's own source, as the "
    "doctor does before a launch; tests/patches covers the launcher in the repository",
    "eagle3_draft_norms": f"its proof compares the draft's outputs with those of sglang {NEWEST_CHECKED}, which a "
    "machine "
    "serving one release does not have; tests/patches covers it in the repository, on both releases",
}


def uncovered() -> dict[str, str]:
    """Every patch and instrument of the library no check observes, with the reason the report gives."""
    import eagle3_patches

    covered = {c.patch for c in CHECKS}
    return {
        name: NO_CHECK.get(
            name, f"no selftest check observes this patch yet (eagle3_patches/selftest/checks/{name}.py)"
        )
        for name in eagle3_patches.known_names()
        if name not in covered
    }
