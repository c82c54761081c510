"""Whether HiCache's storage tier (L3, ``--hicache-storage-backend``) carries a speculative draft's KV pages, per
sglang release and backend: the table the ``hicache_draft_kv`` patch's launcher check and its doctor rule both read.
Never imports sglang.

Read from the wheels (``managers/cache_controller.py``, ``mem_cache/hybrid_cache/hybrid_cache_controller.py``,
``mem_cache/hicache_storage.py`` and each backend under ``mem_cache/storage/``):

- before :data:`~.releases.HICACHE_DRAFT_L3_FROM` HiCache keeps no draft KV at all (the patch refuses HiCache with a
  draft there; this table is not consulted);
- from :data:`~.releases.HICACHE_DRAFT_L3_FROM`: the draft's pages go to the backend through its generic
  ``batch_set(keys, values)`` / ``batch_get(keys, buffers)``, and any failure is swallowed at debug level.  ``file``
  stores them.  ``mooncake`` and ``simm`` assert the zero-copy arguments that path never passes, ``hf3fs``'s two
  methods are empty: nothing is stored and nothing read back, silently;
- from :data:`~.releases.HICACHE_DRAFT_L3_PER_BACKEND_FROM`: ``_maybe_register_draft_with_storage`` picks the path:
  mooncake's zero-copy pool (not with split heads: a ``tp_lcm_size`` above the TP size, a per-head target and the
  ``page_head`` layout), the generic path for ``file`` and the rest, and for ``hf3fs``, ``eic``, ``nixl`` and
  ``simm`` nothing but one warning at start, "HiCache draft L3 disabled";
- from :data:`~.releases.HICACHE_DRAFT_SIDECAR_FROM`: the draft is a sidecar pool of the unified radix cache, moved by
  ``batch_set_v2`` / ``batch_get_v2`` with the default hit policy "all pages": a prefix whose draft pages are not in
  storage is a miss, recomputed, instead of a target-only hit (read for ``file`` and ``mooncake``).

In every era an MLA target's KV is the same on every TP rank, so only TP rank 0 writes to storage
(``backup_skip``), and the ``file`` backend's keys carry no rank; a per-head (Llama-class) draft's KV is split by
heads over the ranks, so every other rank reads rank 0's heads back.  Only mooncake, from
:data:`~.releases.HICACHE_DRAFT_SIDECAR_FROM`, writes such a draft's pages on every rank under keys of their own.

What this does not establish: the backends whose draft path was not followed to the bytes (``nixl``, ``eic``,
``aibrix``, ``dynamic`` in the generic eras; everything but ``file`` and ``mooncake`` in the sidecar era) are
warned about, not refused, and not declared safe."""

from __future__ import annotations

import json
from dataclasses import dataclass

from packaging.version import Version

from ..sglang_version import base_release
from .releases import HICACHE_DRAFT_L3_FROM, HICACHE_DRAFT_L3_PER_BACKEND_FROM, HICACHE_DRAFT_SIDECAR_FROM

FLAG = "--hicache-storage-backend"
#: generic era: backends whose ``batch_set`` / ``batch_get`` ignore or reject what the draft's path passes
GENERIC_DROPS = ("mooncake", "hf3fs", "simm")
#: per-backend era: backends sglang skips for the draft, with its "HiCache draft L3 disabled" warning
REGISTRATION_SKIPS = ("hf3fs", "eic", "nixl", "simm")
#: the backends whose draft path was read to the bytes, per era (the first release of the era -> backends)
CARRIES = {
    HICACHE_DRAFT_L3_FROM: ("file",),
    HICACHE_DRAFT_L3_PER_BACKEND_FROM: ("file", "mooncake"),
    HICACHE_DRAFT_SIDECAR_FROM: ("file", "mooncake"),
}
EXPECTED = (
    "the draft's pages written to the storage tier and read back with the target's, on every rank that holds them"
)
CONSEQUENCE = (
    "so a prefix prefetched from storage restores the target's KV and leaves the draft's as another request wrote "
    "it: the outputs stay right, the accept length falls once prefixes come back from storage"
)


# pragma: no mutate core/ReplaceTrueWithFalse: nothing assigns to a setup's fields; frozen says so
@dataclass(frozen=True)
class StorageSetup:
    """What decides it: the release, ``--hicache-storage-backend``, the attention-TP size, whether the draft keeps
    its KV per head beside an MLA target (:func:`~.formats.per_head_draft_beside_mla`) and whether mooncake splits
    heads (:func:`splits_heads`)."""

    version: Version
    backend: str | None
    attention_tp: int
    per_head_draft_beside_mla: bool
    split_heads: bool


# pragma: no mutate core/ReplaceTrueWithFalse: nothing assigns to a verdict's fields; frozen says so
@dataclass(frozen=True)
class StorageVerdict:
    refuse: bool  # False: a warning (not established)
    what: str
    found: str
    fix: str
    expected: str = EXPECTED


def tp_lcm_size(extra_config: str | None) -> int | None:
    """``tp_lcm_size`` from ``--hicache-storage-backend-extra-config`` given inline as JSON (``@file`` is not read:
    None, as for junk)."""
    if not extra_config:
        return None
    try:  # ``@file`` is no JSON: None
        value = json.loads(extra_config)
    except ValueError:
        return None
    lcm = value.get("tp_lcm_size") if isinstance(value, dict) else None
    return lcm if isinstance(lcm, int) and not isinstance(lcm, bool) else None


def splits_heads(backend: str | None, extra_config: str | None, tp: int, layout: str | None, mla_target: bool) -> bool:
    """mooncake's ``should_split_heads`` (``_generate_storage_config``): a ``tp_lcm_size`` above the TP size, a
    target whose KV is per head and the ``page_head`` host layout."""
    lcm = tp_lcm_size(extra_config)
    return backend == "mooncake" and lcm is not None and lcm > tp and layout == "page_head" and not mla_target


def draft_storage_verdict(s: StorageSetup) -> StorageVerdict | None:
    """None where the draft's pages travel with the target's (or there is no storage tier, or the release has no
    draft KV in HiCache at all); else whether the launch is refused and why."""
    if not s.backend:
        return None
    v = base_release(s.version)
    if v < HICACHE_DRAFT_L3_FROM:
        return None
    backend = s.backend
    found = f"{FLAG} {backend} on sglang {s.version}"
    per_tp = s.per_head_draft_beside_mla and s.attention_tp > 1
    sidecar = v >= HICACHE_DRAFT_SIDECAR_FROM
    carried = CARRIES[max(k for k in CARRIES if k <= v)]
    if per_tp and not (sidecar and backend == "mooncake"):
        if sidecar and backend != "file":
            return _not_read(s, found + f", a per-head draft beside an MLA target at attention TP {s.attention_tp}")
        return StorageVerdict(
            True,
            f"HiCache's storage tier with a per-head (Llama-class) draft beside an MLA target at attention TP "
            f"{s.attention_tp} on sglang {s.version}: only TP rank 0 writes to storage and every rank reads the pages "
            f"rank 0 wrote, so ranks 1-{s.attention_tp - 1} load rank 0's draft heads, {CONSEQUENCE}",
            found + f", a per-head draft beside an MLA target at attention TP {s.attention_tp}",
            f"drop {FLAG} (the host tier keeps each rank's draft KV), serve an MLA draft, or use {FLAG} mooncake on "
            f"sglang >= {HICACHE_DRAFT_SIDECAR_FROM}, which writes a per-head draft's pages on every rank",
        )
    if backend in carried and not (backend == "mooncake" and s.split_heads and not sidecar):
        return None
    if not sidecar and v >= HICACHE_DRAFT_L3_PER_BACKEND_FROM and (backend in REGISTRATION_SKIPS or s.split_heads):
        why = "mooncake with split heads" if backend == "mooncake" else f"the {backend} backend"
        return StorageVerdict(
            True,
            f"HiCache's storage tier with a speculative draft on sglang {s.version}: sglang skips the draft's pages "
            f'for {why} (one line at start, "HiCache draft L3 disabled"), {CONSEQUENCE}',
            found + (" with split heads (tp_lcm_size)" if backend == "mooncake" else ""),
            f"use {FLAG} file or mooncake{' without tp_lcm_size' if backend == 'mooncake' else ''}, or drop {FLAG} "
            "(the host tier keeps the draft's KV)",
        )
    # pragma: no mutate core/ReplaceComparisonOperator_Lt_LtE: at HICACHE_DRAFT_L3_PER_BACKEND_FROM every backend of
    # GENERIC_DROPS got its verdict above (mooncake carried or split, the others skipped)
    if v < HICACHE_DRAFT_L3_PER_BACKEND_FROM and backend in GENERIC_DROPS:
        return StorageVerdict(
            True,
            f"HiCache's storage tier with a speculative draft on sglang {s.version}: the {backend} backend never "
            f"stores the draft's pages (sglang's generic write fails and is swallowed at debug level), {CONSEQUENCE}, "
            "with nothing logged",
            found,
            f"use {FLAG} file, or mooncake on sglang >= {HICACHE_DRAFT_L3_PER_BACKEND_FROM}, or drop {FLAG} (the host "
            "tier keeps the draft's KV)",
        )
    return _not_read(s, found)


def _not_read(s: StorageSetup, found: str) -> StorageVerdict:
    return StorageVerdict(
        False,
        f"HiCache's storage tier with a speculative draft on sglang {s.version}: whether the {s.backend} backend "
        f"stores and reads back the draft's pages here was not established; where it does not, {CONSEQUENCE}",
        found,
        f"watch the accept length once prefixes come back from storage (the watchdog warns), or use {FLAG} file"
        + (" or mooncake" if base_release(s.version) >= HICACHE_DRAFT_L3_PER_BACKEND_FROM else ""),
    )
