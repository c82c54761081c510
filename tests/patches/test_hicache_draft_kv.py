"""hicache_draft_kv: HiCache beside a draft model is refused at start where HiCache restores only the target's KV."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.releases import only_release, requires_patch

from eagle3_patches.diagnostic import ERROR
from eagle3_patches.doctor import doctor
from eagle3_patches.patches import hicache_draft_kv as hk
from eagle3_patches.selftest import PASSED


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: EAGLE3 with and without HiCache resolved as the launcher resolves them, stock and then
    with the patch set applied in the same process."""
    return run_check("hicache_draft_kv")


@pytest.mark.sglang
@pytest.mark.stock
@requires_patch("hicache_draft_kv")
@only_release("<0.5.11", "the host-tier refusal; from 0.5.11 the storage tier is judged")
def test_stock_resolves_hicache_with_eagle3_and_moves_no_draft_kv(check):
    from importlib.util import find_spec

    assert check.observations["stock"]["hicache"] == ("ok", "EAGLE3")
    assert check.bug == "present"
    # the release's own HiCache controller has no draft pool: what the refusal stands on
    srt = Path(find_spec("sglang").origin).parent / "srt"  # type: ignore[arg-type, union-attr]
    assert "draft" not in (srt / "managers/cache_controller.py").read_text()
    assert hk.moves_draft_kv(srt) is None


@pytest.mark.sglang
@requires_patch("hicache_draft_kv")
@only_release("<0.5.11", "the host-tier refusal; from 0.5.11 the storage tier is judged")
def test_patched_refuses_hicache_naming_the_flag_and_the_fixing_release(check):
    assert check.status == PASSED, check.reason
    kind, message = check.observations["patched"]["hicache"]
    assert kind == "Eagle3ConfigError"
    assert "--enable-hierarchical-cache" in message and "sglang >= 0.5.11" in message
    assert check.observations["patched"]["no_hicache"] == ("ok", "EAGLE3")


@pytest.mark.parametrize(
    "files, found",
    [
        ({"managers/cache_controller.py": "class HiCacheController:\n    def set_draft_kv_pool(self, d, h):\n"}, True),
        ({"speculative/base_spec_worker.py": "class HiCacheDraftMode(str, Enum):\n"}, True),
        ({"managers/cache_controller.py": "class HiCacheController:\n    def load(self):\n"}, False),
        ({}, False),
    ],
    ids=["0.5.11-0.5.18", "0.5.18-on", "0.5.9", "no-hicache-files"],
)
def test_upstream_probe_reads_each_layout(tmp_path, files, found):
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    (tmp_path / "server_args.py").write_text("")

    why = hk.moves_draft_kv(tmp_path)
    assert (why is not None) is found
    if found:
        assert "defines" in why
    assert hk.PATCH.upstream(object()) is None  # type: ignore[arg-type]  # the storage tier is judged on every release


def test_a_release_whose_server_args_resolve_elsewhere_is_not_patched():
    """The launcher check runs after the method that resolves the flags; a ServerArgs without one is not what the
    patch was written for (not applicable, sglang left untouched) rather than a wrapper that never runs."""
    from types import SimpleNamespace

    from eagle3_patches.registry import NotApplicable

    class ServerArgs:
        pass

    with pytest.raises(NotApplicable):
        hk.PATCH.check(SimpleNamespace(ServerArgs=ServerArgs))

    class Resolving:
        def __post_init__(self):
            pass

    hk.PATCH.check(SimpleNamespace(ServerArgs=Resolving))  # sglang's shape: accepted


#: every algorithm sglang serves with a draft model, which keeps a KV cache of its own (written out, not read from the
#: patch: a name the patch forgets must fail here)
KEEP_DRAFT_KV = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


def test_check_names_the_flag_only_where_a_draft_keeps_kv():
    class Args:
        def __init__(self, algorithm, hicache):
            self.speculative_algorithm, self.enable_hierarchical_cache = algorithm, hicache

    for algorithm in KEEP_DRAFT_KV:
        with pytest.raises(hk.Eagle3ConfigError, match="--enable-hierarchical-cache"):
            hk.check_hicache(Args(algorithm.lower(), True))
    for algorithm, hicache in (("EAGLE3", False), ("NGRAM", True), (None, True)):
        hk.check_hicache(Args(algorithm, hicache))  # silent


CODE = "hicache-draft-kv"
HICACHE = "--speculative-algorithm EAGLE3 --enable-hierarchical-cache"


@pytest.mark.sglang
@requires_patch("hicache_draft_kv")
@only_release("<0.5.11", "the host-tier refusal; from 0.5.11 the storage tier is judged")
def test_every_algorithm_this_release_serves_with_a_draft_model_is_refused_with_hicache():
    """sglang's own list of algorithms (all but NONE and NGRAM run a draft model with its own KV cache)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    class Args:
        enable_hierarchical_cache = True

    drafting = [a.name for a in SpeculativeAlgorithm if a.name not in ("NONE", "NGRAM")]
    assert drafting
    for name in drafting:
        args = Args()
        args.speculative_algorithm = name
        with pytest.raises(hk.Eagle3ConfigError, match=f"--speculative-algorithm {name}"):
            hk.check_hicache(args)


@pytest.mark.parametrize("algorithm", KEEP_DRAFT_KV)
def test_the_doctor_refuses_hicache_with_each_algorithm_that_runs_a_draft_model(tiny, algorithm):
    launch = HICACHE.replace("EAGLE3", algorithm)
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.9", launch=launch)
    assert CODE in r.codes(ERROR), r.format()
    assert f"--speculative-algorithm {algorithm}" in r.format()


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10"])
def test_the_doctor_refuses_hicache_with_a_draft(tiny, version):
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version=version, launch=HICACHE)
    assert CODE in r.codes(ERROR), r.format()
    assert "--enable-hierarchical-cache" in r.format() and "sglang >= 0.5.11" in r.format()


def test_the_doctor_says_the_patched_launch_stops_at_start(tiny):
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version="0.5.9", launch=HICACHE, with_patches=True)
    assert CODE in r.codes(ERROR), r.format()
    assert "hicache_draft_kv" in r.format()


@pytest.mark.parametrize(
    "version, launch",
    [
        ("0.5.11", HICACHE),  # the draft's KV pool registered with the HiCache controller
        ("0.5.23", HICACHE),
        ("0.5.9", "--speculative-algorithm EAGLE3"),  # no HiCache
        ("0.5.9", "--speculative-algorithm NGRAM --enable-hierarchical-cache"),  # no draft model
    ],
)
def test_the_doctor_is_silent_where_the_drafts_kv_is_safe(tiny, version, launch):
    r = doctor(tiny["kimi_k25"], tiny["draft"], sglang_version=version, launch=launch)
    assert CODE not in r.codes(), r.format()
