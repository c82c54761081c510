"""Environment variables, read in one place.

| variable | meaning |
|---|---|
| ``EAGLE3_PATCHES_APPLY`` | set by ``eagle3-patches run``: ``all`` or a comma list of patch names to apply in every process (read by the bootstrap ``sitecustomize``) |
| ``EAGLE3_PATCHES_DISABLE`` | comma list of patch names never to apply (status: ``disabled``) |
| ``EAGLE3_PATCHES_ENABLE`` | comma list of off-by-default patches to apply as well |
| ``EAGLE3_PATCHES_CPU_PROFILE`` | ``1``: activate the CPU profile (refused when CUDA is available); ``force``: activate even then |
| ``EAGLE3_PATCHES_UPGRADE_ALGORITHM`` | ``1``: ``--speculative-algorithm EAGLE`` with an EAGLE-3 draft is upgraded to ``EAGLE3`` with a warning instead of refused |
| ``EAGLE3_PATCHES_ON_ERROR`` | ``warn`` (default): a patch that fails to apply is logged and reported ``failed``; ``raise``: the import that triggered it fails |
"""

from __future__ import annotations

import os

APPLY = "EAGLE3_PATCHES_APPLY"
DISABLE = "EAGLE3_PATCHES_DISABLE"
ENABLE = "EAGLE3_PATCHES_ENABLE"
CPU_PROFILE = "EAGLE3_PATCHES_CPU_PROFILE"
UPGRADE_ALGORITHM = "EAGLE3_PATCHES_UPGRADE_ALGORITHM"
ON_ERROR = "EAGLE3_PATCHES_ON_ERROR"


def name_list(var: str) -> frozenset[str]:
    raw = os.environ.get(var, "")
    return frozenset(n.strip() for n in raw.replace(";", ",").split(",") if n.strip())


def flag(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on", "force"}


def raise_on_patch_error() -> bool:
    return os.environ.get(ON_ERROR, "warn").strip().lower() == "raise"
