"""The CPU profile: run real sglang model code on a machine without a GPU.

Kept apart from the EAGLE-3 patch set and enabled only on request
(``eagle3-patches run --cpu-profile``, ``EAGLE3_PATCHES_CPU_PROFILE=1`` or
:func:`activate`).  It refuses to activate where CUDA is available unless forced.
It sets the environment, installs import-only stand-ins for CUDA-only packages
(only where the real one cannot be imported) and applies the CPU workarounds.
Because it sets environment variables, sglang's ``spawn``-ed children inherit it
through the bootstrap ``sitecustomize``.
"""

from __future__ import annotations

import logging
import os

from .. import settings
from .stubs import install_stubs
from .workarounds import build_registry

logger = logging.getLogger("eagle3_patches")

#: Environment the CPU path needs; set with setdefault so a user's value wins.
CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "TORCHDYNAMO_DISABLE": "1",  # else the first prefill compiles biased_grouped_topk with g++ (~27 s)
    "TRITON_INTERPRET": "1",  # EAGLE's draft backend is triton; must be set before triton is imported
}

_registry = None


def get_registry():
    global _registry
    if _registry is None:
        _registry = build_registry()
    return _registry


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def activate(force: bool = False) -> None:
    """Activate the CPU profile in this process (and, through the environment, its children)."""
    force = force or settings.current().cpu_profile == "force"
    if not force and _cuda_available():
        raise RuntimeError(
            "eagle3-patches: the CPU profile was requested but CUDA is available; it would replace "
            f"GPU code paths. Unset {settings.CPU_PROFILE}, or set it to 'force' if you really mean it."
        )
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    os.environ[settings.CPU_PROFILE] = "force" if force else "1"  # for the children (spawn) this process starts

    install_stubs()
    get_registry().apply()


def is_active() -> bool:
    return _registry is not None and any(s.state.value != "not-selected" for s in _registry.status().values())
