"""eagle3_target_capability

Bug: nothing checks at start that the target model class can capture EAGLE-3 aux states.  A target without
``set_eagle3_layers_to_capture`` / ``get_embed_and_head`` (sglang 0.5.9's Kimi-K2.5 wrapper without the
delegation, or any wrapper model that never got the hooks) fails only later, inside every TP rank's scheduler.

What users see: one bare ``AttributeError`` per rank, raised in the schedulers after the launcher has already
started them.

What the patch changes: after ``ServerArgs`` resolved the flags (``__post_init__``; ``resolve_once`` from 0.5.23),
with ``--speculative-algorithm EAGLE3``, it resolves the target's architecture through sglang's own
``ModelRegistry`` and raises ``Eagle3TargetError`` in the launcher when the class lacks either method: one message,
before any rank exists (vLLM's ``SupportsEagle3`` check), naming the class, the missing method and the fix (the
patch of this library that makes the class capture, when one exists).  It costs one registry lookup at start.

Releases: 0.5.8 and later (vLLM's ``SupportsEagle3`` check has no counterpart in any sglang release checked).

Upstream probe: none; the check runs in the launcher, before any rank is spawned.

Tests: ``tests/patches/test_eagle3_target_capability.py``, ``tests/distributed/test_tp2_server.py``: with the Kimi
delegation disabled the launcher refuses with the class, the missing method and the fix named; with it (and for
DeepSeek-V3) it is silent; stock lets ``ServerArgs`` through and the real TP 2 server then dies in every rank.
"""

from __future__ import annotations

import json
from pathlib import Path

from packaging.specifiers import SpecifierSet

from ..errors import Eagle3TargetError
from . import LauncherCheck, get_registry

#: what sglang's EAGLE-3 path calls on the target (model_runner.py, eagle_worker.py)
REQUIRED = ("set_eagle3_layers_to_capture", "get_embed_and_head")


def _architectures(model_path: str) -> list[str]:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return []  # a hub id or an unreadable config: sglang reports those itself
    archs = config.get("architectures") if isinstance(config, dict) else None
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def check_target_supports_eagle3(server_args) -> None:
    """Refuse EAGLE3 at start, in the launcher, when the target class lacks the capture hooks."""
    if (server_args.speculative_algorithm or "").upper() != "EAGLE3":
        return
    archs = _architectures(server_args.model_path)
    if not archs:
        return
    from sglang.srt.models.registry import ModelRegistry

    try:
        cls, arch = ModelRegistry.resolve_model_cls(archs)
    except Exception:  # noqa: BLE001 - an unknown architecture is sglang's own error to report
        return
    missing = [m for m in REQUIRED if not callable(getattr(cls, m, None))]
    if missing:
        helper = next((p for p in get_registry().patches() if arch in p.targets), None)
        if helper is not None and helper.applies_to:
            first_fixed = next((s.version for s in helper.applies_to if s.operator == "<"), None)
            fix = (
                f"enable eagle3-patches' {helper.name} for {arch} (remove it from EAGLE3_PATCHES_DISABLE; it applies "
                "to "
                f"sglang {', '.join(str(s) for s in helper.applies_to)})"
                + (f", or upgrade sglang to >= {first_fixed}" if first_fixed else "")
            )
        else:
            fix = (
                "serve this target without an EAGLE-3 draft (no patch of eagle3-patches makes it capture on this"
                " release)"
            )
        raise Eagle3TargetError(
            f"the target model {arch} cannot serve an EAGLE-3 draft: it has no {' / '.join(missing)}",
            where=f"--model-path {server_args.model_path} (architectures {archs}) with --speculative-algorithm EAGLE3",
            found=f"{cls.__module__}.{cls.__qualname__} without {', '.join(missing)}",
            expected="a target that captures aux hidden states (set_eagle3_layers_to_capture) and shares its "
            "embedding and lm_head (get_embed_and_head)",
            fix=fix,
        )


class Eagle3TargetCapability(LauncherCheck):
    name = "eagle3_target_capability"
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 80
    summary = "EAGLE3 with a target that cannot capture aux states is refused once, in the launcher"
    applies_to = SpecifierSet(">=0.5.8")

    launcher_check = staticmethod(check_target_supports_eagle3)


PATCH = Eagle3TargetCapability()
