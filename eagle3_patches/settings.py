"""Environment variables, read in one place.

| variable | meaning |
|---|---|
| ``EAGLE3_PATCHES_APPLY`` | set by ``eagle3-patches run``: ``all`` or a comma list of patch names to apply in every process (read by the bootstrap ``sitecustomize``) |
| ``EAGLE3_PATCHES_DISABLE`` | comma list of patch names never to apply (status: ``disabled``) |
| ``EAGLE3_PATCHES_ENABLE`` | comma list of off-by-default patches to apply as well |
| ``EAGLE3_PATCHES_CPU_PROFILE`` | ``1``: activate the CPU profile (refused when CUDA is available); ``force``: activate even then |
| ``EAGLE3_PATCHES_UPGRADE_ALGORITHM`` | ``1``: ``--speculative-algorithm EAGLE`` with an EAGLE-3 draft is upgraded to ``EAGLE3`` with a warning instead of refused |
| ``EAGLE3_PATCHES_DUMP_DIR`` | with the off-by-default ``hidden_state_dump`` patch enabled: the directory its safetensors shards (aux hidden states + token ids of served requests) go to; unset: nothing is dumped |
| ``EAGLE3_PATCHES_DUMP_LAYER_IDS`` | ``hidden_state_dump`` without EAGLE3 speculation: the aux layer ids to capture (comma list, the installed sglang's convention, e.g. ``1,2,3``); default: the ``--speculative-draft-model-path`` config's ids |
| ``EAGLE3_PATCHES_DUMP_SHARD_TOKENS`` | ``hidden_state_dump``: rows (tokens) per shard before it is written (default 4096; a partial shard is also written after one idle second and at exit) |
| ``EAGLE3_PATCHES_ON_ERROR`` | ``warn`` (default): a patch that fails to apply is logged and reported ``failed``; ``raise``: the import that triggered it fails |
| ``EAGLE3_PATCHES_PROBE`` | off by default (unset, ``0``). ``1``: the diagnostic probe (patch ``eagle3_probe``, set by ``eagle3-patches run --probe``) logs what enters and leaves the EAGLE-3 path once per process, forward mode and hop; a path: also JSON lines there (a directory: ``probe-<pid>.jsonl`` per process; a ``*.jsonl`` file: appended by every process), read by ``eagle3-patches probe-report`` |
"""

from __future__ import annotations

import os

APPLY = "EAGLE3_PATCHES_APPLY"
DISABLE = "EAGLE3_PATCHES_DISABLE"
ENABLE = "EAGLE3_PATCHES_ENABLE"
CPU_PROFILE = "EAGLE3_PATCHES_CPU_PROFILE"
UPGRADE_ALGORITHM = "EAGLE3_PATCHES_UPGRADE_ALGORITHM"
ON_ERROR = "EAGLE3_PATCHES_ON_ERROR"
PROBE = "EAGLE3_PATCHES_PROBE"

_OFF = frozenset({"", "0", "false", "no", "off"})
_ON = frozenset({"1", "true", "yes", "on"})
DUMP_DIR = "EAGLE3_PATCHES_DUMP_DIR"
DUMP_LAYER_IDS = "EAGLE3_PATCHES_DUMP_LAYER_IDS"
DUMP_SHARD_TOKENS = "EAGLE3_PATCHES_DUMP_SHARD_TOKENS"


def name_list(var: str) -> frozenset[str]:
    raw = os.environ.get(var, "")
    return frozenset(n.strip() for n in raw.replace(";", ",").split(",") if n.strip())


def flag(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on", "force"}


def raise_on_patch_error() -> bool:
    return os.environ.get(ON_ERROR, "warn").strip().lower() == "raise"


def probe_setting() -> tuple[bool, str | None]:
    """``EAGLE3_PATCHES_PROBE``: (on, output path or None for log lines only)."""
    raw = os.environ.get(PROBE, "").strip()
    if raw.lower() in _OFF:
        return False, None
    if raw.lower() in _ON:
        return True, None
    return True, raw
