"""sglang's own way in: the ``sglang.srt.plugins`` entry point (sglang >= 0.5.11).

Installed next to sglang 0.5.11 or later, eagle3-patches is a general sglang plugin
(``pyproject.toml``: ``[project.entry-points."sglang.srt.plugins"]``): sglang calls :func:`activate`
in the launcher before it parses the flags, in ``Engine``, in every scheduler process (every TP
rank) and, from 0.5.23, in the detokenizer and the data-parallel controller.  So a plain
``python -m sglang.launch_server ...`` gets the patch set in every process, no wrapper and no
``PYTHONPATH``; ``eagle3-patches run`` stays for 0.5.9 / 0.5.10 (no plugin mechanism) and for whoever
wants it explicit.  Both can be active at once: applying is idempotent.

Activation policy (docs/patches.md, "How it gets into sglang"): on when installed, as sglang
discovers plugins; ``SGLANG_PLUGINS`` (sglang's allow-list) without ``eagle3_patches`` keeps it out;
``EAGLE3_PATCHES_PLUGIN=0`` switches the plugin off; ``EAGLE3_PATCHES_DISABLE=all`` switches every
patch off, whichever way it came in.  The plugin never activates the CPU profile and imports nothing
of sglang (the patches land when sglang imports their modules).

sglang logs and swallows an exception a plugin raises; a patch that fails to apply therefore rolls
back its whole selection and is logged (sglang runs unpatched, said loudly), and with
``EAGLE3_PATCHES_ON_ERROR=raise`` the process exits instead.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import eagle3_patches

from . import settings
from .errors import PatchError

if TYPE_CHECKING:  # the plugin runs in every sglang process: it imports nothing it does not use there
    from .checkpoint.releases import ReleaseFacts

logger = logging.getLogger("eagle3_patches")

#: the entry point's name: what ``SGLANG_PLUGINS`` lists to allow it
ENTRY_POINT = "eagle3_patches"
GROUP = "sglang.srt.plugins"


def loaded_here(rf: ReleaseFacts, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether sglang release ``rf``, installed in this environment, loads this plugin in processes started with
    ``environ`` (default: this process's), and why (the doctor's answer to "will the server run under
    eagle3-patches?", asked with the launch's environment; never called in a serving process)."""
    import importlib.metadata

    v = rf.version
    if not rf.has_plugins:
        return False, f"sglang {v} has no plugin entry points (0.5.11+): only `eagle3-patches run` brings the patches"
    names = {ep.name for ep in importlib.metadata.entry_points(group=GROUP)}
    if ENTRY_POINT not in names:
        return False, f"eagle3-patches is not installed here as a package with its {GROUP} entry point"
    env = os.environ if environ is None else environ
    if not settings.read(env).plugin:
        return False, f"the sglang plugin is switched off ({settings.PLUGIN}=0)"
    # read as sglang's load_plugins (sglang/srt/plugins/__init__.py, 0.5.11 to 0.5.23) reads it: a non-empty value
    # is an allow-list of its comma-separated names, stripped (a value of blanks lists none: no plugin loads)
    allowed = env.get("SGLANG_PLUGINS", "")
    if allowed and ENTRY_POINT not in {n.strip() for n in allowed.split(",")}:
        return False, f"SGLANG_PLUGINS={allowed!r} does not list {ENTRY_POINT}"
    return True, f"sglang {v} loads eagle3-patches as a plugin here ({settings.PLUGIN}=0 switches it off)"


def _say(level: int, message: str) -> None:
    """Log ``message``; where logging would drop it, write it to stderr.  sglang calls ``load_plugins()`` before
    it applies ``--log-level`` (0.5.11: in the launcher and in each scheduler; 0.5.23: in the launcher, with the
    root logger left at WARNING by an import), so an INFO record would be lost there, and the process would not
    say which patch set it runs: one line a process, whatever the level."""
    if logger.isEnabledFor(level) and logger.hasHandlers():
        logger.log(level, message)
    else:
        sys.stderr.write(f"[{logging.getLevelName(level)}] {message}\n")


def activate() -> None:
    """Called by sglang's ``load_plugins()`` in each of its processes."""
    s = settings.current()
    if not s.plugin:
        _say(logging.INFO, f"eagle3-patches: sglang plugin switched off ({settings.PLUGIN}=0) in pid {os.getpid()}")
        return

    try:
        states = eagle3_patches.apply(s.apply_names if s.apply else None)
    except PatchError as exc:
        if s.on_error == "raise":
            raise SystemExit(str(exc)) from None  # sglang catches Exception from plugins, not SystemExit
        _say(logging.ERROR, f"{exc}; sglang runs WITHOUT eagle3-patches in pid {os.getpid()}")
        return
    summary = ", ".join(f"{n}={st.state.value}" for n, st in states.items())
    _say(logging.INFO, f"eagle3-patches: active in pid {os.getpid()} through the sglang plugin entry point: {summary}")
