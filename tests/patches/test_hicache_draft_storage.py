"""hicache_draft_kv, the storage tier (L3): where a release's storage backend does not carry the draft's pages, the
launcher refuses (or warns about) HiCache with a draft model and the doctor says so; silent where they travel.

The table's evidence is sglang's own HiCache controller on CPU (``tests/support/hicache_storage.py``): those
tests run on the releases whose controller keeps the draft pool (0.5.11 - 0.5.18), so in the release matrix
(``tools/matrix.py --releases 0.5.12 --tests tests/patches/test_hicache_draft_storage.py``), not on the pinned or
the newest release."""

from __future__ import annotations

import logging

import pytest
from packaging.version import Version
from support.releases import only_release

from eagle3_patches.checkpoint import hicache_storage as L3
from eagle3_patches.diagnostic import ERROR, WARNING
from eagle3_patches.doctor import doctor
from eagle3_patches.patches import hicache_draft_kv as hk
from eagle3_patches.selftest import PASSED
from eagle3_patches.testing.isolation import run_isolated

CODE = "hicache-draft-storage"
REFUSE, WARN = "refuse", "warn"


def setup(version: str, backend: str | None, **kw) -> L3.StorageSetup:
    """A launch at attention TP 1, without a per-head draft beside an MLA target or split heads, but ``kw``."""
    fields = dict(attention_tp=1, per_head_draft_beside_mla=False, split_heads=False)
    return L3.StorageSetup(Version(version), backend, **{**fields, **kw})


def verdict(version: str, backend: str | None, **kw) -> str | None:
    v = L3.draft_storage_verdict(setup(version, backend, **kw))
    return None if v is None else (REFUSE if v.refuse else WARN)


# each row read from the wheels (checkpoint/hicache_storage.py says where); written out, not derived from the table
@pytest.mark.parametrize(
    "version, backend, expected",
    [
        ("0.5.10", "mooncake", None),  # no draft KV in HiCache at all: the host-tier rule refuses it
        ("0.5.11", None, None),  # HiCache without a storage tier
        ("0.5.11", "file", None),
        ("0.5.11", "mooncake", REFUSE),  # generic batch_set asserts zero-copy arguments, swallowed at debug level
        ("0.5.12", "hf3fs", REFUSE),  # generic batch_set / batch_get are empty
        ("0.5.12", "simm", REFUSE),
        ("0.5.12", "nixl", WARN),  # not followed to the bytes
        ("0.5.10.post1", "file", None),
        ("0.5.13", "file", None),
        ("0.5.13", "mooncake", None),  # mooncake's own draft pool (v2)
        ("0.5.13", "nixl", REFUSE),  # "HiCache draft L3 disabled"
        ("0.5.15.post1", "hf3fs", REFUSE),
        ("0.5.18", "eic", REFUSE),
        ("0.5.18", "simm", REFUSE),
        ("0.5.18", "aibrix", WARN),
        ("0.5.19", "file", None),  # the draft a sidecar pool with the "all pages" hit policy
        ("0.5.19", "mooncake", None),
        ("0.5.19", "nixl", WARN),
        ("0.5.23", "hf3fs", WARN),
        ("0.5.23", "file", None),
    ],
)
def test_each_release_and_backend(version, backend, expected):
    assert verdict(version, backend) == expected


@pytest.mark.parametrize(
    "version, backend, expected",
    [
        ("0.5.12", "file", REFUSE),  # rank 0 alone writes; file keys carry no rank beside an MLA target
        ("0.5.13", "mooncake", REFUSE),  # backup_skip: ranks 1-N never write
        ("0.5.19", "file", REFUSE),  # should_backup keeps rank-specific draft pages for mooncake only
        ("0.5.19", "mooncake", None),
        ("0.5.23", "nixl", WARN),
    ],
)
def test_a_per_head_draft_beside_an_mla_target_over_tp_ranks(version, backend, expected):
    assert verdict(version, backend, attention_tp=2, per_head_draft_beside_mla=True) == expected
    assert verdict(version, backend, attention_tp=1, per_head_draft_beside_mla=True) == verdict(version, backend)
    assert verdict(version, backend, attention_tp=2, per_head_draft_beside_mla=False) == verdict(version, backend)


def test_mooncake_with_split_heads_is_refused_where_sglang_skips_it():
    assert verdict("0.5.13", "mooncake", split_heads=True) == REFUSE
    assert verdict("0.5.18", "mooncake", split_heads=True) == REFUSE
    assert verdict("0.5.19", "mooncake", split_heads=True) is None  # the sidecar path has no such exclusion
    split = L3.splits_heads
    assert split("mooncake", '{"tp_lcm_size": 8}', 4, "page_head", mla_target=False)
    for args in (
        ("mooncake", '{"tp_lcm_size": 8}', 4, "page_head", True),  # MLA KV is replicated, never split
        ("mooncake", '{"tp_lcm_size": 4}', 4, "page_head", False),  # not above the TP size
        ("mooncake", '{"tp_lcm_size": 8}', 4, "layer_first", False),
        ("file", '{"tp_lcm_size": 8}', 4, "page_head", False),
        ("mooncake", "@/etc/hicache.json", 4, "page_head", False),  # a file is not read
        ("mooncake", "{not json", 4, "page_head", False),
        ("mooncake", '{"tp_lcm_size": true}', 0, "page_head", False),
        ("mooncake", None, 4, "page_head", False),
    ):
        assert not split(*args[:4], mla_target=args[4]), args


def test_the_messages_name_the_backend_the_release_and_what_carries_the_pages():
    refused = L3.draft_storage_verdict(setup("0.5.13", "nixl"))
    assert refused is not None and refused.refuse
    assert "nixl" in refused.found and "0.5.13" in refused.found and "HiCache draft L3 disabled" in refused.what
    assert "--hicache-storage-backend file or mooncake" in refused.fix
    early = L3.draft_storage_verdict(setup("0.5.11", "mooncake"))
    assert early is not None and "mooncake on sglang >= 0.5.13" in early.fix and "nothing logged" in early.what
    tp = L3.draft_storage_verdict(setup("0.5.16", "file", attention_tp=8, per_head_draft_beside_mla=True))
    assert tp is not None and "ranks 1-7 load rank 0's draft heads" in tp.what
    assert "mooncake on sglang >= 0.5.19" in tp.fix


def test_each_refusal_names_what_sglang_skips_and_the_fix_that_fits_it():
    nixl = L3.draft_storage_verdict(setup("0.5.13", "nixl"))
    assert nixl is not None and "for the nixl backend" in nixl.what and "split heads" not in nixl.what
    assert "without tp_lcm_size" not in nixl.fix and "split heads" not in nixl.found
    split = L3.draft_storage_verdict(setup("0.5.13", "mooncake", split_heads=True))
    assert split is not None and "for mooncake with split heads" in split.what
    assert "file or mooncake without tp_lcm_size" in split.fix and split.found.endswith(
        "with split heads (tp_lcm_size)"
    )


def test_a_backend_not_followed_to_the_bytes_is_warned_about_naming_what_carries_the_pages_there():
    """The fix of a warning names the backends that carry the draft's pages on that release: ``file`` alone before
    mooncake's own draft pool (0.5.13), both from then on; a per-head draft over ranks on such a backend in the
    sidecar era is warned about, not refused."""
    before = L3.draft_storage_verdict(setup("0.5.12", "nixl"))
    assert before is not None and not before.refuse and before.fix.endswith("--hicache-storage-backend file")
    for version in ("0.5.13", "0.5.19"):
        after = L3.draft_storage_verdict(setup(version, "aibrix"))
        assert after is not None and after.fix.endswith("--hicache-storage-backend file or mooncake"), version
    assert verdict("0.5.19", "aibrix", attention_tp=2, per_head_draft_beside_mla=True) == WARN
    assert verdict("0.5.19", "eic", attention_tp=2, per_head_draft_beside_mla=True) == WARN


# -- the doctor: stock and patched verdicts
HICACHE = "--speculative-algorithm EAGLE3 --enable-hierarchical-cache --hicache-storage-backend {backend}"


@pytest.mark.parametrize(
    "version, backend, tp, draft, severity",
    [
        ("0.5.12", "mooncake", 1, "draft", ERROR),
        ("0.5.13", "nixl", 1, "draft", ERROR),
        ("0.5.13", "file", 8, "draft", ERROR),  # the tiny Kimi-K2.5 (MLA) with its Llama-class draft
        ("0.5.13", "aibrix", 1, "draft", WARNING),
        ("0.5.13", "file", 1, "draft", None),
        ("0.5.13", "file", 8, "mla_draft", None),  # an MLA draft's KV is the same on every rank
        ("0.5.19", "mooncake", 8, "draft", None),
        ("0.5.23", "file", 1, "draft", None),
    ],
)
def test_the_doctor_judges_the_storage_backend(tiny, version, backend, tp, draft, severity):
    launch = HICACHE.format(backend=backend) + f" --tp {tp}"
    stock = doctor(tiny["kimi_k25"], tiny[draft], sglang_version=version, launch=launch)
    patched = doctor(tiny["kimi_k25"], tiny[draft], sglang_version=version, launch=launch, with_patches=True)
    if severity is None:
        assert CODE not in stock.codes() and CODE not in patched.codes(), stock.format()
        return
    assert CODE in stock.codes(severity), stock.format()
    assert CODE in patched.codes(severity), patched.format()
    (mine,) = [d for d in stock.findings if d.code == CODE]
    (theirs,) = [d for d in patched.findings if d.code == CODE]
    assert f"--hicache-storage-backend {backend} --speculative-algorithm EAGLE3" in mine.where
    said = "refuses this at start" if severity == ERROR else "says this at start and lets it run"
    assert said in theirs.what and said not in mine.what


def per_head_target(tiny, root):
    """The tiny Kimi-K2.5 with its KV per head (no ``kv_lora_rank``): a target mooncake can split by heads."""
    import json
    import shutil

    target = shutil.copytree(tiny["kimi_k25"], root / "per-head-target")
    config = json.loads((target / "config.json").read_text())
    for section in (config, config.get("text_config") or {}):
        section.pop("kv_lora_rank", None)
    (target / "config.json").write_text(json.dumps(config))
    return target


#: mooncake splitting heads: tp_lcm_size above the TP size and the page_head host layout
SPLIT = (
    HICACHE.format(backend="mooncake")
    + " --hicache-mem-layout page_head --hicache-storage-backend-extra-config '{\"tp_lcm_size\": 4}'"
)


def test_the_doctor_refuses_mooncake_splitting_a_per_head_targets_heads_and_not_an_mla_targets(tiny, tmp_path):
    """mooncake splits the heads of a per-head target only (an MLA target's KV has none to split)."""
    split = doctor(per_head_target(tiny, tmp_path), tiny["draft"], sglang_version="0.5.13", launch=SPLIT)
    assert CODE in split.codes(ERROR), split.format()
    (said,) = [d for d in split.findings if d.code == CODE]
    assert "split heads" in said.found
    mla = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.13", launch=SPLIT)
    assert CODE not in mla.codes(), mla.format()


def test_the_doctor_keeps_the_host_tier_rule_before_the_draft_pool(tiny):
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.10", launch=HICACHE.format(backend="nixl"))
    assert "hicache-draft-kv" in r.codes(ERROR) and CODE not in r.codes(), r.format()


# -- the launcher: real ServerArgs on the installed release (the selftest check)
@pytest.fixture(scope="module")
def check(run_check):
    return run_check("hicache_draft_kv")


@pytest.mark.sglang
@only_release(">=0.5.11", "the storage rule runs where HiCache moves the draft's KV to the host")
def test_the_launcher_refuses_the_per_head_draft_at_tp2_and_passes_file_storage(check):
    assert check.status == PASSED, check.reason
    stock, patched = check.observations["stock"], check.observations["patched"]
    assert stock["file_tp2"] == ("ok", "EAGLE3")  # stock starts it
    kind, message = patched["file_tp2"]
    assert kind == "Eagle3ConfigError" and "--hicache-storage-backend file" in message
    assert "rank 0" in message
    for name in ("hicache", "no_hicache", "file"):
        assert patched[name] == ("ok", "EAGLE3"), name


def launch(monkeypatch, **fields):
    """What ``check_hicache_storage`` reads of sglang's ServerArgs, on 0.5.13: EAGLE3, HiCache, ``file`` at TP 1 and
    hub ids, but ``fields``."""
    from types import SimpleNamespace

    monkeypatch.setattr(hk, "installed_sglang_version", lambda: Version("0.5.13"))
    base = dict(
        speculative_algorithm="EAGLE3",
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        tp_size=1,
        dp_size=1,
        enable_dp_attention=False,
        model_path="org/hub-id",
        speculative_draft_model_path="org/hub-id",
    )
    return SimpleNamespace(**{**base, **fields})


def test_the_launcher_check_warns_once_where_the_backend_is_not_established(monkeypatch, caplog):
    args = launch(monkeypatch, hicache_storage_backend="aibrix")
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        hk.check_hicache_storage(args)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "aibrix" in caplog.text and "was not established" in caplog.text
    args.hicache_storage_backend = "eic"
    with pytest.raises(hk.Eagle3ConfigError, match="HiCache draft L3 disabled"):
        hk.check_hicache_storage(args)
    args.hicache_storage_backend = "file"
    hk.check_hicache_storage(args)  # silent
    args.enable_hierarchical_cache = False
    args.hicache_storage_backend = "eic"
    hk.check_hicache_storage(args)  # no HiCache: nothing to judge


@pytest.mark.parametrize(
    "tp, dp, dp_attention, target, refused",
    [
        (2, 1, False, "kimi_k25", True),  # the per-head draft beside the MLA target at attention TP 2
        (2, 2, True, "kimi_k25", False),  # DP attention: each replica spans one rank
        (2, 2, False, "kimi_k25", True),  # dp without DP attention leaves the attention TP at 2
        (1, 1, False, "kimi_k25", False),
        (2, 1, False, None, False),  # a hub id: the launcher cannot read it, the doctor does
    ],
)
def test_the_launcher_check_reads_the_attention_tp_and_the_checkpoints_of_the_launch(
    tiny, monkeypatch, tp, dp, dp_attention, target, refused
):
    """What ``check_hicache_storage`` reads of sglang's ServerArgs: the ranks one attention replica spans, and the
    target and draft checkpoints where they are local directories (0.5.13, the ``file`` backend)."""

    args = launch(
        monkeypatch,
        tp_size=tp,
        dp_size=dp,
        enable_dp_attention=dp_attention,
        model_path=str(tiny[target]) if target else "moonshotai/Kimi-K2.5",
        speculative_draft_model_path=str(tiny["draft"]),
    )
    if refused:
        with pytest.raises(hk.Eagle3ConfigError, match="rank 0"):
            hk.check_hicache_storage(args)
    else:
        hk.check_hicache_storage(args)


@pytest.mark.parametrize(
    "target, draft, tp, refused",
    [
        ("per_head", "draft", 1, True),
        ("kimi_k25", "draft", 1, False),
        ("kimi_k25", "mla_draft", 2, False),  # neither split heads nor a per-head draft over two ranks
        (None, "draft", 1, False),
    ],
)
def test_the_launcher_refuses_mooncake_splitting_heads_only_where_it_read_a_per_head_target(
    tiny, tmp_path, monkeypatch, target, draft, tp, refused
):
    """mooncake with ``tp_lcm_size`` above the TP size and the ``page_head`` layout splits a per-head target's
    heads (0.5.13 skips the draft's pages then); an MLA target is never split, and a target the launcher cannot
    read (a hub id) is left to the doctor rather than refused on a guess."""
    path = {"per_head": per_head_target(tiny, tmp_path), "kimi_k25": tiny["kimi_k25"], None: "moonshotai/Kimi-K2.5"}
    args = launch(
        monkeypatch,
        hicache_storage_backend="mooncake",
        hicache_mem_layout="page_head",
        hicache_storage_backend_extra_config='{"tp_lcm_size": 4}',
        tp_size=tp,
        model_path=str(path[target]),
        speculative_draft_model_path=str(tiny[draft]),
    )
    if refused:
        with pytest.raises(hk.Eagle3ConfigError, match="split heads"):
            hk.check_hicache_storage(args)
    else:
        hk.check_hicache_storage(args)


def test_the_launcher_check_passes_a_checkpoint_it_cannot_read(tmp_path, tiny, monkeypatch):
    """A target directory whose config does not parse: the launcher leaves it to sglang's loader (its own error)."""
    broken = tmp_path / "target"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")

    hk.check_hicache_storage(
        launch(monkeypatch, tp_size=2, model_path=str(broken), speculative_draft_model_path=str(tiny["draft"]))
    )


def test_the_launcher_check_passes_an_mtp_launch_without_a_draft_path(tiny, monkeypatch):
    """NEXTN reads the target's own MTP layers: no draft path (None), nothing for the launcher to read beside it."""

    hk.check_hicache_storage(
        launch(
            monkeypatch,
            speculative_algorithm="NEXTN",
            tp_size=2,
            model_path=str(tiny["kimi_k25"]),
            speculative_draft_model_path=None,
        )
    )


# -- sglang's real HiCache controller on CPU
def _round_trips(directory: str) -> dict:
    from pathlib import Path

    from support import hicache_storage as probe

    out = {}
    for name in ("file", "nixl"):
        (Path(directory) / name).mkdir()
        out[name] = probe.round_trip(name, str(Path(directory) / name))
    return out


@pytest.mark.sglang
@only_release(">=0.5.11,<0.5.19", "the controller's draft pool (set_draft_kv_pool) of these releases")
def test_the_real_controller_carries_the_drafts_page_through_file_storage(tmp_path):
    seen = run_isolated(_round_trips, str(tmp_path))
    # file: the target's page and the draft's page both come back from storage into the other host slot
    assert seen["file"]["target"] and seen["file"]["draft"], seen["file"]


@pytest.mark.sglang
@only_release(">=0.5.13,<0.5.19", "sglang picks the draft's storage path per backend")
def test_a_backend_the_release_skips_restores_the_target_and_not_the_draft(tmp_path):
    seen = run_isolated(_round_trips, str(tmp_path))
    nixl = seen["nixl"]
    # the table's refusal stands on this: the target's page comes back, the draft's slot keeps another request's KV
    assert nixl["target"] and not nixl["draft"], nixl
    assert nixl["draft_path"] == "none"
    assert any("HiCache draft L3 disabled" in line for line in nixl["logged"])
    assert verdict("0.5.13", "nixl") == REFUSE and verdict("0.5.13", "file") is None


def _two_ranks(directory: str) -> dict:
    from support import hicache_storage as probe

    return probe.two_ranks(directory)


@pytest.mark.sglang
@only_release(">=0.5.11,<0.5.19", "rank 0 alone backs up beside an MLA target (backup_skip) in these releases")
def test_rank_1_gets_rank_0s_draft_heads_back_from_storage_beside_an_mla_target(tmp_path):
    seen = run_isolated(_two_ranks, str(tmp_path))
    # rank 1's per-head draft page held 3.0, rank 0's 2.0: the prefetch on rank 1 brings back rank 0's heads
    assert seen == {"rank1_draft": 2.0, "rank1_own": False}, seen
    assert verdict("0.5.13", "file", attention_tp=2, per_head_draft_beside_mla=True) == REFUSE


def _generic(backend: str) -> dict:
    from support import hicache_storage as probe

    return probe.generic_draft_path(backend)


@pytest.mark.sglang
@only_release(">=0.5.11,<0.5.13", "one generic draft path for every backend")
@pytest.mark.parametrize("backend", ["mooncake", "hf3fs"])
def test_the_generic_draft_path_drops_the_page_on_zero_copy_backends_with_nothing_logged(backend):
    seen = run_isolated(_generic, backend)
    assert not seen["draft"], seen  # and nothing raised: the controller swallows it
    assert all(level in ("DEBUG", "INFO") for level, _ in seen["logged"]), seen["logged"]
    assert verdict("0.5.12", backend) == REFUSE
