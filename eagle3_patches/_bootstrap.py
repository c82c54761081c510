"""What the bootstrap ``sitecustomize`` does in every process started under ``eagle3-patches run``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import eagle3_patches

from . import cpu, settings
from .errors import Eagle3Error

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"

logger = logging.getLogger("eagle3_patches")


def activate_from_env() -> None:
    """Activate the CPU profile and/or the patch set as the settings ask (what a user would call by hand)."""
    s = settings.current()
    if s.cpu_profile:
        cpu.activate()
    if s.apply:
        eagle3_patches.apply(s.apply_names)
        _install_excepthook()
        logger.debug("eagle3-patches active in pid %d", os.getpid())


def _install_excepthook() -> None:
    """A user mistake caught by a guard prints its message, not a traceback."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if isinstance(exc, Eagle3Error):
            sys.stderr.write(f"{exc}\n")
        else:
            previous(exc_type, exc, tb)

    sys.excepthook = hook


def child_environment(
    *,
    patches: str = "all",
    cpu_profile: bool = False,
    disable: list[str] | None = None,
    base: dict | None = None,
    probe: str | None = None,
) -> dict[str, str]:
    """The environment ``eagle3-patches run`` gives the command it starts.

    ``probe``: ``"1"`` (log lines) or an output path switches the diagnostic probe on
    (``EAGLE3_PATCHES_PROBE``: the instrument follows its own setting).
    """
    env = dict(os.environ if base is None else base)
    pythonpath = env.get("PYTHONPATH", "")
    parts = [p for p in pythonpath.split(os.pathsep) if p and Path(p).resolve() != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), *parts])
    if probe is not None:
        env[settings.PROBE] = probe
    env[settings.APPLY] = patches
    if cpu_profile:
        env.setdefault(settings.CPU_PROFILE, "1")
    if disable:
        current = settings.names(env.get(settings.DISABLE, ""))
        env[settings.DISABLE] = ",".join(sorted(current | set(disable)))
    return env
