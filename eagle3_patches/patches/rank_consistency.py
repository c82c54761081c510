"""rank_consistency

Bug: nothing checks that every rank of one server runs the same patch set.  Kimi-K2.5 often spans two nodes
(TP 16 on 80 GB GPUs), each with its own launcher: a node started without ``eagle3-patches run`` (or without the
plugin, with another ``EAGLE3_PATCHES_DISABLE`` or another library version) serves with some ranks patched and
some not.

What users see: nothing at start and no error: the server starts and serves while capture widths or layer ids
differ between its ranks, silently.

What the patch changes: at the target model's load (``ModelRunner.load_model`` of the target runner, in every TP
rank; a draft runner's load is not checked, and each process checks once) each rank writes its patch set (library
version and every patch's state) to torch.distributed's default store, the TCPStore all ranks of the server
already share across nodes, then waits up to ``EAGLE3_PATCHES_RANK_CHECK_TIMEOUT`` seconds (default 120; 0
switches the check off) for every other rank's.  No collective is used: a rank without eagle3-patches never
writes, and the patched ranks name it after the timeout instead of hanging in a collective it never joins.  Any
difference: every rank that sees it refuses to start (``Eagle3ConfigError``), naming the ranks and the patches
that differ.  A server of one rank has nothing to compare.  Not in the fork series: it compares eagle3-patches'
own patch sets, and a forked sglang runs without the library.

Releases: every release (a deployment guard: sglang has no notion of it).

Upstream probe: none.

Tests: ``tests/unit/test_rank_consistency_store.py`` (the comparison on torch's own stores, without sglang: each
rank publishes its own set, each difference is named with both ranks, eight at most are shown, another library
version is named, a rank that never reports is named after the timeout; the model-load hook checks the target
once per process and nothing else, with two gloo ranks and with one), ``tests/distributed/test_rank_consistency.py``
(two sglang ranks loading the tiny target, TP 2 over gloo on CPU: the same patch set starts; rank 1 started with
``EAGLE3_PATCHES_DISABLE=eagle3_fc_guard`` starts silently on stock, and with the check both ranks refuse, naming
the patch; a rank without eagle3-patches is named by rank 0 instead of a hang).
"""

from __future__ import annotations

import json
import logging
import os
from datetime import timedelta
from types import ModuleType

from packaging.specifiers import SpecifierSet

from .. import settings
from ..diagnostic import first_few
from ..errors import Eagle3ConfigError
from ..registry import Patch, Saver, expect_attr
from ..version import __version__
from . import get_registry

logger = logging.getLogger("eagle3_patches")

NAME = "rank_consistency"
KEY = "eagle3_patches/patch_set/rank{rank}"
_checked: set[int] = set()


def patch_set() -> dict:
    """This rank's patch set: what every rank of one server must agree on."""
    return {"eagle3_patches": __version__, "patches": {n: s.state.value for n, s in get_registry().status().items()}}


def _differences(mine: dict, rank: int, theirs: dict, other: int) -> list[str]:
    out = []
    if mine["eagle3_patches"] != theirs["eagle3_patches"]:
        out.append(
            f"eagle3-patches {mine['eagle3_patches']} on rank {rank}, {theirs['eagle3_patches']} on rank {other}"
        )
    for name in sorted(set(mine["patches"]) | set(theirs["patches"])):
        a, b = mine["patches"].get(name, "absent"), theirs["patches"].get(name, "absent")
        if a != b:
            out.append(f"{name}: {a} on rank {rank}, {b} on rank {other}")
    return out


def check_ranks(store, rank: int, world: int, timeout_s: float) -> None:
    """Publish this rank's patch set in ``store`` and compare it with every other rank's (raises on a difference)."""
    mine = patch_set()
    # pragma: no mutate core/ReplaceTrueWithFalse: the other ranks parse the JSON back into dicts before comparing: the
    # keys' order is never compared
    store.set(KEY.format(rank=rank), json.dumps(mine, sort_keys=True))
    others = [r for r in range(world) if r != rank]
    keys = [KEY.format(rank=r) for r in others]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception:  # noqa: BLE001 - torch raises DistStoreError / RuntimeError on timeout
        silent = [r for r, k in zip(others, keys) if not store.check([k])]
        raise Eagle3ConfigError(
            f"rank(s) {silent} of this {world}-rank server did not report an eagle3-patches patch set within "
            f"{timeout_s:g} s: they run without eagle3-patches, so the ranks would capture different states",
            where=f"tp rank {rank} (pid {os.getpid()}), at model load",
            found=f"no patch set from rank(s) {silent}",
            expected=f"every one of the {world} ranks under eagle3-patches with the same patch set",
            fix="start every node's launcher the same way (eagle3-patches run, or the sglang plugin on sglang >= "
            "0.5.11, "
            f"with the same {settings.DISABLE}), with the same eagle3-patches installed; {settings.RANK_CHECK_TIMEOUT} "
            "gives slow nodes longer",
        ) from None
    found = []
    for r, k in zip(others, keys):
        found += _differences(mine, rank, json.loads(store.get(k)), r)
    if found:
        raise Eagle3ConfigError(
            "the ranks of this server run different eagle3-patches patch sets: their aux capture would differ",
            where=f"tp rank {rank} (pid {os.getpid()}), at model load",
            found=first_few(found, 8, "; "),
            expected=f"the same patch set on all {world} ranks",
            fix=f"start every node the same way, with the same {settings.DISABLE} and the same eagle3-patches version",
        )
    logger.info(
        "eagle3-patches: rank %d/%d pid %d: the same patch set on all %d ranks (%s)",
        rank,
        world,
        os.getpid(),
        world,
        ", ".join(f"{n}={s}" for n, s in mine["patches"].items()),
    )


def _checked_load_model(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    timeout = settings.current().rank_check_timeout
    if getattr(instance, "is_draft_worker", False) or not timeout or os.getpid() in _checked:
        return result
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return result
    _checked.add(os.getpid())
    from torch.distributed import distributed_c10d

    check_ranks(distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size(), timeout)
    return result


class RankConsistency(Patch):
    name = NAME
    order = 5
    summary = "every rank of a server checks at model load that all ranks run the same patch set"
    module = "sglang.srt.model_executor.model_runner"
    applies_to = SpecifierSet(">=0.5.8")
    remedy = "refused"
    in_fork_series = False  # it compares eagle3-patches' own patch sets: a forked sglang runs without the library

    def check(self, module: ModuleType) -> None:
        # pragma: no mutate eagle3/DeleteCallStatement: without the check, `saver.wrap` of the same attribute raises
        # `NotApplicable` where `ModelRunner` lacks `load_model` (the state is `not-applicable` either way, only the
        # reason's words differ)
        expect_attr(module.ModelRunner, "load_model")

    def patch(self, module: ModuleType, saver: Saver) -> None:
        saver.wrap(module.ModelRunner, "load_model", _checked_load_model)


PATCH = RankConsistency()
