"""rank_consistency's comparison on torch's own stores, without sglang: what a rank publishes, what it names
when another rank differs or never reports, and when the model-load hook checks at all (two gloo ranks).

The whole path, two sglang ranks loading the tiny target, is in tests/distributed/test_rank_consistency.py.
"""

from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace

import pytest

torch_dist = pytest.importorskip("torch.distributed")

from eagle3_patches import settings  # noqa: E402
from eagle3_patches.errors import Eagle3ConfigError  # noqa: E402
from eagle3_patches.patches import rank_consistency as rc  # noqa: E402
from eagle3_patches.testing.isolation import run_ranks  # noqa: E402


def _publish(store, rank: int, patch_set: dict) -> None:
    store.set(rc.KEY.format(rank=rank), json.dumps(patch_set))


def _refusal(store, rank: int, world: int, timeout_s: float = 5) -> Eagle3ConfigError:
    with pytest.raises(Eagle3ConfigError) as info:
        rc.check_ranks(store, rank, world, timeout_s)
    return info.value


def test_ranks_that_agree_start_and_each_publishes_its_own_set(caplog):
    store = torch_dist.HashStore()
    mine = rc.patch_set()
    assert mine["eagle3_patches"] and set(mine["patches"]) >= {rc.NAME}
    _publish(store, 0, mine)
    _publish(store, 2, mine)
    with caplog.at_level(logging.INFO, logger="eagle3_patches"):
        rc.check_ranks(store, 1, 3, 5)
    assert json.loads(store.get(rc.KEY.format(rank=1))) == mine
    assert f"rank 1/3 pid {os.getpid()}: the same patch set on all 3 ranks" in caplog.text
    assert f"{rc.NAME}={mine['patches'][rc.NAME]}" in caplog.text


def test_each_difference_is_named_with_both_ranks():
    """Another library version, another state of one patch, a patch one side lacks and one only it has: the
    rank that sees it names each, its own rank and state first."""
    mine = rc.patch_set()
    names = sorted(mine["patches"])
    theirs = {"eagle3_patches": "0.0.0", "patches": dict(mine["patches"])}
    theirs["patches"][names[0]] = "disabled" if mine["patches"][names[0]] != "disabled" else "applied"
    del theirs["patches"][names[1]]
    theirs["patches"]["zz_only_there"] = "applied"
    store = torch_dist.HashStore()
    _publish(store, 0, mine)
    _publish(store, 2, theirs)
    err = _refusal(store, 1, 3)
    assert (
        err.what == "the ranks of this server run different eagle3-patches patch sets: their aux capture would differ"
    )
    assert err.found == "; ".join(
        [
            f"eagle3-patches {mine['eagle3_patches']} on rank 1, 0.0.0 on rank 2",
            f"{names[0]}: {mine['patches'][names[0]]} on rank 1, {theirs['patches'][names[0]]} on rank 2",
            f"{names[1]}: {mine['patches'][names[1]]} on rank 1, absent on rank 2",
            "zz_only_there: absent on rank 1, applied on rank 2",
        ]
    )
    assert (err.where, err.expected) == (
        f"tp rank 1 (pid {os.getpid()}), at model load",
        "the same patch set on all 3 ranks",
    )
    assert settings.DISABLE in err.fix


def test_many_differences_are_shown_eight_at_most():
    mine = rc.patch_set()
    theirs = {"eagle3_patches": mine["eagle3_patches"], "patches": {f"p{i:02d}": "applied" for i in range(12)}}
    theirs["patches"].update(mine["patches"])
    store = torch_dist.HashStore()
    _publish(store, 1, theirs)
    found = _refusal(store, 0, 2).found
    assert (
        found.endswith(" ...")
        and found.count("; ") == 7
        and found.startswith("p00: absent on rank 0, applied on rank 1")
    )


def test_a_rank_that_never_reports_is_named_after_the_timeout():
    store = torch_dist.HashStore()
    _publish(store, 2, rc.patch_set())
    err = _refusal(store, 0, 4, timeout_s=0.25)
    assert err.what == (
        "rank(s) [1, 3] of this 4-rank server did not report an eagle3-patches patch set within 0.25 s: "
        "they run without eagle3-patches, so the ranks would capture different states"
    )
    assert (err.found, err.expected) == (
        "no patch set from rank(s) [1, 3]",
        "every one of the 4 ranks under eagle3-patches with the same patch set",
    )
    assert err.where == f"tp rank 0 (pid {os.getpid()}), at model load"
    assert settings.RANK_CHECK_TIMEOUT in err.fix and settings.DISABLE in err.fix


def _hook_observations(rank: int, world: int, port: int) -> dict:
    """One gloo rank: the model-load hook before the process group exists, for a draft runner, with the check
    off, for the target runner, and for the target again."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    loads = []

    def load_model():
        loads.append(1)
        return f"model {len(loads)}"

    def hook(runner):
        return rc._checked_load_model(load_model, runner, (), {})

    def published(store) -> bool:
        return store.check([rc.KEY.format(rank=rank)])

    target, draft = SimpleNamespace(is_draft_worker=False), SimpleNamespace(is_draft_worker=True)
    out = {"before init": hook(target)}
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    store = distributed_c10d._get_default_store()
    out["draft"] = (hook(draft), published(store))
    settings.reload({settings.RANK_CHECK_TIMEOUT: "0"})
    out["check off"] = (hook(target), published(store))
    settings.reload({settings.RANK_CHECK_TIMEOUT: "30"})
    out["target"] = (hook(object()), published(store))  # a runner without is_draft_worker is a target's
    dist.barrier()
    store.delete_key(rc.KEY.format(rank=rank))
    out["target again"] = (hook(target), published(store))  # checked once per process: nothing published again
    dist.barrier()
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("world", [2, 1])
def test_the_model_load_hook_checks_the_target_once_per_process_and_nothing_else(world):
    """Two ranks: the target's first load publishes and compares; one rank alone has no one to compare with."""
    out = run_ranks(_hook_observations, world, cpu_profile=False, timeout=180)
    assert (
        out
        == [
            {
                "before init": "model 1",  # no process group: nothing to compare with
                "draft": ("model 2", False),
                "check off": ("model 3", False),
                "target": ("model 4", world > 1),
                "target again": ("model 5", False),
            }
        ]
        * world
    )


def test_another_version_is_named_whichever_sorts_first():
    """The versions are compared for equality: a newer one on the other rank (here mine with a local tag, which
    sorts after it) is named as an older one is."""
    mine = rc.patch_set()
    store = torch_dist.HashStore()
    _publish(store, 1, {**mine, "eagle3_patches": mine["eagle3_patches"] + "+other"})
    assert (
        _refusal(store, 0, 2).found
        == f"eagle3-patches {mine['eagle3_patches']} on rank 0, {mine['eagle3_patches']}+other on rank 1"
    )
