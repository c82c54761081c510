"""hicache_draft_kv

Bug: HiCache (``--enable-hierarchical-cache``) moves the target's KV between the GPU and the host tier and never the
draft's.  A prefix loaded back from the host gets new device slots; the target's KV is restored into them, the draft's
KV at those slots is whatever the request that last used them wrote.  The draft then attends over another request's
states and its tokens are rejected: the outputs stay right (the target verifies), the accept length falls after the
cache fills and evicts, and nothing is logged (sglang issue #32176 shows the same collapse, 4.49 to 1.59, on a later
release's draft state HiCache did not yet move).  sglang 0.5.11 registers the draft's KV pool with the HiCache
controller (``HiCacheController.set_draft_kv_pool``), so every backup and load moves it with the target's; 0.5.18
extends that to a draft's indexer and sliding-window state (PR #30393).  No backport is small and sure: the fix is a
host pool for the draft and a change to every transfer of the controller.

What users see: Kimi-K2.5 with an EAGLE-3 draft and HiCache serves correct outputs at the expected accept length
until long or many prompts fill the cache; from then on requests whose prefix comes back from the host are accepted
far less often, and a ``flush_cache`` brings it back for a while.

What the patch changes: it refuses the launch.  Once ``ServerArgs`` has resolved the flags (in the launcher, before
any rank starts), HiCache with a speculative algorithm that runs a draft model (EAGLE, EAGLE3, NEXTN, STANDALONE) is
refused with ``Eagle3ConfigError`` naming ``--enable-hierarchical-cache`` and the release that fixes it.  Under
``eagle3-patches run`` the launcher prints the message without a traceback.

The storage tier (L3, ``--hicache-storage-backend``): from 0.5.11 the draft's pages travel to storage and back only on
some backends, and where they do not a prefix prefetched from storage restores the target's KV and not the draft's,
the same collapse one tier further down.  Where the release moves the draft's KV to the host (the upstream probe
below), the patch judges the storage backend instead, by the table of ``checkpoint/hicache_storage.py``: a backend
whose draft pages are known not to travel (0.5.11 - 0.5.12: mooncake, hf3fs and simm, silently; 0.5.13 - 0.5.18:
hf3fs, eic, nixl, simm and mooncake with split heads, "HiCache draft L3 disabled" once at start), and a per-head
draft beside an MLA target at attention TP > 1 (only rank 0 writes, every rank reads rank 0's heads: every backend
through 0.5.18, ``file`` from 0.5.19), is refused the same way, naming the backend, the release and what carries the
draft's pages; a backend whose draft path was not established on that release is let through with one warning;
``file`` (and mooncake from 0.5.13) starts silently.

Releases: every release: HiCache itself on 0.5.8 - 0.5.10 (read: 0.5.9 and 0.5.10 have no draft pool in
``managers/cache_controller.py``; 0.5.11 to 0.5.18 have ``set_draft_kv_pool``, 0.5.18 on the sidecar draft plan of
``speculative/base_spec_worker.py``); the storage tier from 0.5.11 (read: the draft's path in 0.5.11, 0.5.13,
0.5.19 and the newest release checked, and that it is the same in the releases between).

Upstream probe: none for the patch (no release carries the draft's pages on every storage backend).  sglang's own
source beside ``server_args.py`` decides which rule the launcher runs: ``HiCacheController.set_draft_kv_pool`` or the
sidecar draft plan (``HiCacheDraftMode``) means the draft's KV moves to the host with the target's, and only the
storage backend is judged.

Tests: ``tests/patches/test_hicache_draft_kv.py``: real ``ServerArgs`` of 0.5.9 for the tiny Kimi-K2.5 target and
its EAGLE-3 draft: stock resolves HiCache with EAGLE3 (asserted) and 0.5.9's cache controller has no draft pool;
patched refuses it naming the flag and 0.5.11, stays silent without HiCache and for NGRAM; the probe on each
layout; the doctor's ``hicache-draft-kv`` (stock and patched verdicts, silent from 0.5.11).
``tests/patches/test_hicache_draft_storage.py``: the storage table per release and backend; the doctor's
``hicache-draft-storage`` (an error, a warning or silence, stock and patched); on a release from 0.5.11 the launcher's
real ``ServerArgs`` with ``file`` (silent) and the per-head draft at TP 2 (refused); sglang's real
``HiCacheController`` backup and prefetch with the real ``file`` backend and host pools on CPU
(``tests/support/hicache_storage.py``, on 0.5.11 - 0.5.18): the draft's page comes back from storage with
the target's; for a backend the release skips, the target's comes back and the draft's slot keeps another request's
values; at TP 2, rank 1 gets rank 0's draft heads back; on 0.5.11 - 0.5.12 the real mooncake and hf3fs classes store
nothing of the draft, logging at DEBUG at most.

Not verified on CPU: the acceptance collapse itself.  HiCache's device-host transfers are CUDA kernels, so no CPU
server serves a prefix back from storage; and what such a restore leaves, the draft's prefix KV written by another
request, was tried on the real EAGLE worker with the trained tiny draft (each request's draft KV swapped with
another's after the prefill): its accept length did not fall, the tiny draft's proposals leaning on its input
states and hardly on its context, so the collapse needs a real draft.  The backends other than ``file`` (mooncake,
hf3fs, nixl, eic, simm need their services) are judged from their code only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

from packaging.specifiers import SpecifierSet

from ..checkpoint import formats
from ..checkpoint import hicache_storage as L3
from ..checkpoint.launch_args import attention_tp_size
from ..checkpoint.releases import HICACHE_DRAFT_L3_FROM
from ..diagnostic import ERROR, WARNING, Diagnostic, Diagnostics
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr
from ..sglang_runtime import after_resolution, server_args_resolution_method
from ..sglang_version import installed_sglang_version

# pragma: no mutate core/AddNot: only mypy reads PatchSetup here; importing preflight at run time as well changes
# nothing a test or an operator sees
if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

logger = logging.getLogger("eagle3_patches")

NAME = "hicache_draft_kv"
FIXED_IN = "0.5.11"
FLAG = "--enable-hierarchical-cache"
#: the speculative algorithms whose draft model keeps a KV cache of its own (NGRAM has none)
DRAFT_KV_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
#: where sglang's HiCache moves the draft's KV with the target's: (file beside server_args.py, what it defines)
UPSTREAM_MARKERS = (
    ("managers/cache_controller.py", "def set_draft_kv_pool("),
    ("speculative/base_spec_worker.py", "class HiCacheDraftMode("),
)
WHAT = (
    "HiCache with a speculative draft on sglang {version}: a prefix loaded back from the host tier restores the "
    "target's KV and not the draft's, so the draft attends over another request's states and the accept length "
    "falls once the cache fills, with nothing logged"
)
EXPECTED = f"the draft's KV moved with the target's (sglang >= {FIXED_IN})"
FIX = f"drop {FLAG}, or upgrade to sglang >= {FIXED_IN}, whose HiCache moves the draft's KV with the target's"


def _algorithm(server_args) -> str:
    return str(server_args.speculative_algorithm or "").upper()


def check_hicache(server_args) -> None:
    """Refuse HiCache beside a draft model on a release whose HiCache moves only the target's KV."""
    algorithm = _algorithm(server_args)
    if not server_args.enable_hierarchical_cache or algorithm not in DRAFT_KV_ALGORITHMS:
        return
    raise Eagle3ConfigError(
        WHAT.format(version=installed_sglang_version()),
        where=f"{FLAG} --speculative-algorithm {algorithm}",
        found=f"HiCache on, {algorithm} with a draft model",
        expected=EXPECTED,
        fix=FIX,
    )


def moves_draft_kv(sglang_srt: Path) -> str | None:
    """What in the sglang source tree at ``sglang_srt`` (the ``srt`` directory) moves the draft's KV with the
    target's, or None."""
    for relative, marker in UPSTREAM_MARKERS:
        try:
            if marker in (sglang_srt / relative).read_text(encoding="utf-8"):
                return f"{relative} defines {marker.removeprefix('def ').removeprefix('class ').rstrip('(')}"
        except OSError:
            continue
    return None


STORAGE_CODE = "hicache-draft-storage"


def _storage_where(backend: str | None, algorithm: str) -> str:
    return f"{FLAG} {L3.FLAG} {backend} --speculative-algorithm {algorithm}"


class _Checkpoints(NamedTuple):
    mla_target: bool
    per_head_draft_beside_mla: bool


def _checkpoints(server_args) -> _Checkpoints | None:
    """What the launch's local checkpoints say; None where either is a hub id or cannot be read: the launcher cannot
    tell, so it refuses nothing that hinges on them (the doctor reads them)."""
    target, draft = server_args.model_path, server_args.speculative_draft_model_path
    if not (target and draft and os.path.isdir(target) and os.path.isdir(draft)):
        return None
    try:
        mla = formats.target_view(formats.read_config(target, "target")).mla
        return _Checkpoints(mla, formats.per_head_draft_beside_mla(target, draft))
    except Eagle3ConfigError:
        return None


def check_hicache_storage(server_args) -> None:
    """Refuse (or warn about) HiCache's storage tier beside a draft model where the release's storage backend does
    not carry the draft's pages (``checkpoint/hicache_storage.py``)."""
    algorithm = _algorithm(server_args)
    backend = getattr(server_args, "hicache_storage_backend", None)
    if not server_args.enable_hierarchical_cache or algorithm not in DRAFT_KV_ALGORITHMS:
        return
    version = installed_sglang_version()
    # pragma: no mutate eagle3/DropGuard: the launcher runs inside sglang, whose version is always found
    if version is None:
        return
    tp = attention_tp_size(server_args.tp_size, server_args.dp_size, bool(server_args.enable_dp_attention))
    read = _checkpoints(server_args)
    extra = getattr(server_args, "hicache_storage_backend_extra_config", None)
    layout = getattr(server_args, "hicache_mem_layout", None)
    verdict = L3.draft_storage_verdict(
        L3.StorageSetup(
            version,
            backend,
            attention_tp=tp,
            per_head_draft_beside_mla=read is not None and read.per_head_draft_beside_mla,
            split_heads=read is not None and L3.splits_heads(backend, extra, tp, layout, read.mla_target),
        )
    )
    if verdict is None:
        return
    where = _storage_where(backend, algorithm)
    if verdict.refuse:
        raise Eagle3ConfigError(
            verdict.what, where=where, found=verdict.found, expected=verdict.expected, fix=verdict.fix
        )
    said = Diagnostic.make(WARNING, STORAGE_CODE, verdict.what, where=where, found=verdict.found, fix=verdict.fix)
    logger.warning("%s", said.render("eagle3-patches: "))


class HicacheDraftKv(Patch):
    name = NAME
    # pragma: no mutate core/NumberReplacer: `order` only sorts the patches, and one off sorts them alike
    # (tests/unit/test_registry.py holds every order marked so to it)
    order = 72
    summary = (
        "HiCache with a draft model is refused at start where a prefix comes back without the draft's KV: the host "
        "tier before 0.5.11, a storage backend that skips the draft's pages from then on"
    )
    module = "sglang.srt.server_args"
    # pragma: no mutate eagle3/ShiftReleaseBound: no release before 0.5.9 (PINNED) is checked or served, so a bound at
    # 0.5.7 covers the same releases
    # pragma: no mutate eagle3/CloseReleaseBound: as above, `>0.5.8` covers the same releases
    applies_to = SpecifierSet(">=0.5.8")
    remedy = "refused"

    def upstream(self, module: ModuleType) -> str | None:
        return None  # no release carries the draft's pages on every storage backend

    def check(self, module: ModuleType) -> None:
        server_args = expect_attr(module, "ServerArgs")
        expect_attr(server_args, server_args_resolution_method(server_args))

    def patch(self, module: ModuleType, saver: Saver) -> None:
        server_args = module.ServerArgs
        # where the release moves the draft's KV to the host, only the storage tier is left to judge
        moves = moves_draft_kv(Path(str(module.__file__)).parent)
        check = check_hicache_storage if moves else check_hicache
        saver.wrap(server_args, server_args_resolution_method(server_args), after_resolution(check))

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        if (
            setup.checkpoint_only
            or not setup.launch.enable_hierarchical_cache
            or setup.algorithm not in DRAFT_KV_ALGORITHMS
        ):
            return out
        if setup.rf.base >= HICACHE_DRAFT_L3_FROM:
            return self._storage_preflight(setup, out)
        out.add(
            ERROR,
            "hicache-draft-kv",
            WHAT.format(version=setup.version),
            where=f"{FLAG} --speculative-algorithm {setup.algorithm}",
            found=f"HiCache on, {setup.algorithm} with a draft model",
            expected=EXPECTED,
            fix=FIX,
        )
        return out

    def _storage_preflight(self, setup: PatchSetup, out: Diagnostics) -> Diagnostics:
        launch = setup.launch
        mla = setup.target is not None and setup.target.mla
        verdict = L3.draft_storage_verdict(
            L3.StorageSetup(
                setup.version,
                launch.hicache_storage_backend,
                attention_tp=launch.attention_tp,
                per_head_draft_beside_mla=mla and setup.draft is not None and setup.draft.mla is None,
                split_heads=L3.splits_heads(
                    launch.hicache_storage_backend,
                    launch.hicache_storage_backend_extra_config,
                    launch.tp,
                    launch.hicache_mem_layout,
                    mla,
                ),
            )
        )
        if verdict is not None:
            out.add(
                ERROR if verdict.refuse else WARNING,
                STORAGE_CODE,
                verdict.what,
                where=_storage_where(launch.hicache_storage_backend, setup.algorithm or ""),
                found=verdict.found,
                expected=verdict.expected,
                fix=verdict.fix,
            )
        return out

    def when_patched(self, d: Diagnostic, setup: PatchSetup) -> Diagnostic:
        if d.severity == WARNING:  # let through: the launcher says it once at start
            return d.replace(what=f"{d.what} - eagle3-patches ({self.name}) says this at start and lets it run")
        return super().when_patched(d, setup)


PATCH = HicacheDraftKv()
