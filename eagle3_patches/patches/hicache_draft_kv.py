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

Releases: 0.5.8 - 0.5.10 (read: 0.5.9 and 0.5.10 have no draft pool in ``managers/cache_controller.py``; 0.5.11 to
0.5.18 have ``set_draft_kv_pool``, 0.5.18 on the sidecar draft plan of ``speculative/base_spec_worker.py``).

Upstream probe: sglang's own source beside ``server_args.py``: ``HiCacheController.set_draft_kv_pool`` or the
sidecar draft plan (``HiCacheDraftMode``) means the draft's KV moves with the target's (``upstream``).

Tests: ``tests/patches/test_hicache_draft_kv.py``: real ``ServerArgs`` of 0.5.9 for the tiny Kimi-K2.5 target and
its EAGLE-3 draft: stock resolves HiCache with EAGLE3 (asserted) and 0.5.9's cache controller has no draft pool;
patched refuses it naming the flag and 0.5.11, stays silent without HiCache and for NGRAM; the upstream probe on
each layout; the doctor's ``hicache-draft-kv`` (stock and patched verdicts, silent from 0.5.11).

Not verified on CPU: the acceptance collapse itself (HiCache's transfers are CUDA kernels).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet

from ..diagnostic import ERROR, Diagnostics
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr
from ..sglang_runtime import after_resolution, server_args_resolution_method
from ..sglang_version import installed_sglang_version

if TYPE_CHECKING:  # for the annotations only: a serving process does not load the doctor's layer
    from ..preflight import PatchSetup

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
    if not getattr(server_args, "enable_hierarchical_cache", False) or algorithm not in DRAFT_KV_ALGORITHMS:
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


class HicacheDraftKv(Patch):
    name = NAME
    order = 72
    summary = "HiCache with a draft model, on releases whose HiCache restores only the target's KV, is refused at start"
    module = "sglang.srt.server_args"
    applies_to = SpecifierSet(f">=0.5.8,<{FIXED_IN}")
    remedy = "refused"

    def upstream(self, module: ModuleType) -> str | None:
        found = moves_draft_kv(Path(module.__file__ or "").parent)
        return f"sglang's HiCache moves the draft's KV with the target's ({found})" if found else None

    def check(self, module: ModuleType) -> None:
        server_args = expect_attr(module, "ServerArgs")
        expect_attr(server_args, server_args_resolution_method(server_args))

    def patch(self, module: ModuleType, saver: Saver) -> None:
        server_args = module.ServerArgs
        saver.wrap(server_args, server_args_resolution_method(server_args), after_resolution(check_hicache))

    def preflight(self, setup: PatchSetup) -> Diagnostics:
        out = Diagnostics()
        if (
            setup.checkpoint_only
            or not setup.launch.enable_hierarchical_cache
            or setup.algorithm not in DRAFT_KV_ALGORITHMS
            or not self.covers(setup.version)
        ):
            return out
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


PATCH = HicacheDraftKv()
