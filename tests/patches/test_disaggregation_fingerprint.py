"""disaggregation_fingerprint: the prefill server stamps what it speculates with into the metadata row sglang already
sends per request; the decode server refuses a row that does not match its own, and one without a stamp."""

from __future__ import annotations

import logging

import pytest
from support.releases import requires_patch

from eagle3_patches import settings
from eagle3_patches.patches import disaggregation_fingerprint as fp
from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checks.disaggregation_fingerprint import COMMITTED, REFUSED
from eagle3_patches.testing.isolation import run_isolated


@pytest.fixture(scope="module")
def check(run_check):
    """The selftest check: one request's row per prefill setup through sglang's real ``MetadataBuffers`` and
    ``DecodeTransferQueue._commit_transfer_to_req``, stock then patched."""
    return run_check("disaggregation_fingerprint")


@pytest.mark.sglang
@pytest.mark.stock
@requires_patch("disaggregation_fingerprint")
def test_stock_commits_every_prefill_setup_and_sends_nothing_of_the_speculation(check):
    stock = check.observations["stock"]
    for case in (*REFUSED, *COMMITTED):
        assert stock[case][0] == "ok", (case, stock[case])
        _, abort, row = stock[case][1]
        assert abort is None, case
        assert row[1:] == [0] * 15  # sglang writes the first column only
    assert stock["no_spec"][1][0] == 7  # the token is committed; the draft state it continues from is zero
    assert check.bug == "present"


@pytest.mark.sglang
@pytest.mark.runtime_only
@requires_patch("disaggregation_fingerprint")
def test_patched_refuses_each_mismatch_naming_it_and_commits_the_rest(check):
    assert check.status == PASSED, check.reason
    patched = check.observations["patched"]
    for case, needle in REFUSED.items():
        status, (_, abort, _) = patched[case]
        assert status == "ok" and abort is not None and needle in abort, (case, abort)
        assert "eagle3-patches doctor --prefill CMD --decode CMD" in abort
    for case in COMMITTED:
        assert patched[case][0] == "ok" and patched[case][1][1] is None, case
    token, _, row = patched["same"][1]
    assert token == 7 and row[0] == 7  # sglang's own column untouched
    assert fp.Fingerprint.from_row(row[1:]) is not None and fp.Fingerprint.from_row(row[1:]).speculating
    assert patched["fake"][1][1] is None  # the fake backend moves nothing: nothing to verify, said once


def _fp(**kw) -> fp.Fingerprint:
    base = dict(format=fp.FORMAT, flags=fp.SPECULATING | fp.DRAFT_BY_CONTENT, topk=1, steps=3, draft_tokens=4)
    return fp.Fingerprint(**{**base, "patch_set": 11, "draft": (1, -2, 3), **kw})


def test_a_row_round_trips_and_an_unstamped_row_is_none():
    mine = _fp()
    assert fp.Fingerprint.from_row(mine.row()) == mine
    assert fp.Fingerprint.from_row([0] * 15) is None
    assert fp.Fingerprint.from_row(mine.row()[:5]) is None  # cut short: not a fingerprint
    assert all(-(2**31) <= v < 2**31 for v in mine.row())  # int32 columns


@pytest.mark.parametrize(
    "theirs, needle",
    [
        (_fp(flags=0), "sent no draft state"),
        (_fp(topk=4), "--speculative-eagle-topk: prefill 4, decode 1"),
        (_fp(steps=5), "--speculative-num-steps: prefill 5, decode 3"),
        (_fp(draft_tokens=6), "--speculative-num-draft-tokens: prefill 6, decode 4"),
        (_fp(draft=(1, -2, 4)), "the draft"),
        (_fp(flags=fp.SPECULATING), "the draft"),  # one side hashed the files, the other the name
        (_fp(patch_set=12), "patch set or settings"),
        (_fp(format=fp.FORMAT + 1), "fingerprint format"),
        # below the decode side's value too
        (_fp(topk=0), "--speculative-eagle-topk: prefill 0, decode 1"),
        (_fp(steps=2), "--speculative-num-steps: prefill 2, decode 3"),
        (_fp(draft_tokens=3), "--speculative-num-draft-tokens: prefill 3, decode 4"),
        (_fp(patch_set=10), "patch set or settings"),
        (_fp(format=fp.FORMAT - 1), "fingerprint format"),
        (None, "no eagle3-patches fingerprint"),
    ],
)
def test_each_difference_is_refused_naming_both_sides(theirs, needle):
    exc = fp.refusal(theirs, _fp())
    assert exc is not None and needle in exc.diagnostic.found
    assert "decode: topk 1, steps 3, draft tokens 4" in exc.diagnostic.found
    assert "doctor --prefill CMD --decode CMD" in exc.diagnostic.fix


def test_the_same_fingerprint_is_not_refused():
    assert fp.refusal(_fp(), _fp()) is None


def test_the_selection_ignores_the_order_sglang_modules_are_imported_in(monkeypatch):
    """A patch waiting for its module (``pending``) and the same patch applied count alike: a prefill and a decode
    process import sglang's modules in their own order; a disabled one differs."""
    from types import SimpleNamespace

    from eagle3_patches.registry import State

    def states(**by_name):
        return lambda: {n: SimpleNamespace(state=s) for n, s in by_name.items()}

    registry = SimpleNamespace(status=states(a=State.PENDING, b=State.UPSTREAM))
    monkeypatch.setattr(fp, "get_registry", lambda: registry)
    pending = fp.selection()
    registry.status = states(a=State.APPLIED, b=State.NOT_APPLICABLE)
    assert fp.selection() == pending
    registry.status = states(a=State.DISABLED, b=State.UPSTREAM)
    assert fp.selection() != pending


def test_a_draft_named_by_a_hub_id_is_fingerprinted_by_the_id(tiny):

    def args(path, revision=None):
        return _server_args(speculative_draft_model_path=path, speculative_draft_model_revision=revision)

    local = fp.fingerprint_of(args(str(tiny["draft"])))
    hub = fp.fingerprint_of(args("lightseekorg/kimi-k2.5-eagle3"))
    assert local.flags & fp.DRAFT_BY_CONTENT and not hub.flags & fp.DRAFT_BY_CONTENT
    assert fp.fingerprint_of(args("lightseekorg/kimi-k2.5-eagle3")) == hub
    assert fp.fingerprint_of(args("lightseekorg/kimi-k2.5-eagle3", "v2")).draft != hub.draft
    assert not fp.fingerprint_of(_server_args(speculative_algorithm=None)).speculating


def _server_args(**fields):
    """What ``fingerprint_of`` reads of sglang's ServerArgs: EAGLE3 at topk 2, 3 steps, 5 draft tokens, a hub-id draft
    at TP 1, but ``fields``."""
    from types import SimpleNamespace

    base = dict(
        speculative_algorithm="EAGLE3",
        speculative_draft_model_path="lightseekorg/kimi-k2.5-eagle3",
        speculative_draft_model_revision=None,
        speculative_eagle_topk=2,
        speculative_num_steps=3,
        speculative_num_draft_tokens=5,
        model_path="moonshotai/Kimi-K2.5",
        tp_size=1,
        dp_size=1,
        enable_dp_attention=False,
    )
    return SimpleNamespace(**{**base, **fields})


#: a row as eagle3-patches 0.x writes it (format 1): the prefill and decode sides of a pair may run other versions of
#: the library, and each must read the other's row, so its layout is written out here rather than read from the code
RECORDED_ROW = [0x45335046, 1, 3, 2, 3, 5, -7, 16909060, -1, 0, 4]


def test_the_row_layout_is_the_one_every_version_reads():
    recorded = fp.Fingerprint(1, 3, 2, 3, 5, -7, (16909060, -1, 0), 4)
    assert recorded.row() == RECORDED_ROW and fp.COLUMNS == len(RECORDED_ROW)
    assert fp.Fingerprint.from_row(RECORDED_ROW) == recorded
    assert fp.Fingerprint.from_row(RECORDED_ROW + [9, 9]) == recorded  # sglang's row is wider: the rest is not ours
    assert fp.FORMAT == 1 and fp.FIRST_COLUMN == 1  # sglang writes column 0
    for first in (0x45335046 + 1, 0x45335046 - 1, 0):
        assert fp.Fingerprint.from_row([first, *RECORDED_ROW[1:]]) is None


def test_the_fingerprint_of_a_launch_reads_each_speculative_flag_and_hashes_the_draft_name():
    """Each field from the ServerArgs field it names; a hub-id draft as ``sha256(path@revision)``'s first 12 bytes,
    three little-endian int32 (as a side on another version computes them); the patch set as the first 4 bytes of
    the sha256 of the selection's JSON with sorted keys."""
    import hashlib
    import json
    import struct

    mine = fp.fingerprint_of(_server_args())
    assert (mine.topk, mine.steps, mine.draft_tokens) == (2, 3, 5)
    assert mine.flags == fp.SPECULATING and mine.format == 1 and mine.attention_tp == 1
    named = hashlib.sha256(b"lightseekorg/kimi-k2.5-eagle3@").digest()
    assert mine.draft == struct.unpack("<3i", named[:12])
    selection = hashlib.sha256(json.dumps(fp.selection(), sort_keys=True).encode()).digest()
    assert mine.patch_set == struct.unpack("<i", selection[:4])[0]
    revised = fp.fingerprint_of(_server_args(speculative_draft_model_revision="v2"))
    assert revised.draft == struct.unpack("<3i", hashlib.sha256(b"lightseekorg/kimi-k2.5-eagle3@v2").digest()[:12])


def test_a_local_draft_is_fingerprinted_by_its_files(tiny):
    import struct

    from eagle3_patches.checkpoint.digest import checkpoint_digest

    mine = fp.fingerprint_of(_server_args(speculative_draft_model_path=str(tiny["draft"])))
    files = bytes.fromhex(checkpoint_digest(str(tiny["draft"]), "draft", blocks=64))
    assert mine.draft == struct.unpack("<3i", files[:12]) and mine.flags & fp.DRAFT_BY_CONTENT


@pytest.mark.parametrize(
    "algorithm, speculating",
    [("EAGLE", True), ("EAGLE3", True), ("eagle3", True), ("NEXTN", True), ("NGRAM", False), (None, False)],
)
def test_every_algorithm_that_sends_a_draft_state_is_fingerprinted_as_speculating(algorithm, speculating):
    mine = fp.fingerprint_of(_server_args(speculative_algorithm=algorithm))
    assert mine.speculating is speculating
    if not speculating:  # nothing of a draft: no digest, neither by content nor by name
        assert mine.flags == 0 and mine.draft == (0, 0, 0) and mine.describe() == "no speculation"


def test_a_side_that_does_not_speculate_has_no_per_head_draft(tiny):
    beside = dict(model_path=str(tiny["kimi_k25"]), speculative_draft_model_path=str(tiny["draft"]))
    assert fp.fingerprint_of(_server_args(**beside)).flags & fp.PER_HEAD_DRAFT_KV
    assert not fp.fingerprint_of(_server_args(speculative_algorithm=None, **beside)).flags & fp.PER_HEAD_DRAFT_KV


def test_a_target_whose_config_does_not_parse_has_no_per_head_draft(tmp_path, tiny):
    from types import SimpleNamespace

    (tmp_path / "config.json").write_text("{not json")
    args = SimpleNamespace(model_path=str(tmp_path), speculative_draft_model_path=str(tiny["draft"]))
    assert not fp._per_head_draft_beside_mla(args)


def test_the_description_names_every_field_in_hex_where_it_is_a_digest():
    named = fp.Fingerprint(1, fp.SPECULATING, 1, 3, 4, -1, (-1, 0x12345678, 7), 0)
    assert named.describe() == ("topk 1, steps 3, draft tokens 4, draft ffffffff12345678 (by name), patch set ffffffff")
    files = named.with_flag(fp.DRAFT_BY_CONTENT, True)
    assert files.describe().endswith("draft ffffffff12345678, patch set ffffffff")
    assert named.with_speculating(False).describe() == "no speculation"


def test_an_attention_tp_below_the_decode_sides_is_refused_for_a_per_head_draft():
    per_head = fp.SPECULATING | fp.DRAFT_BY_CONTENT | fp.PER_HEAD_DRAFT_KV
    exc = fp.refusal(_fp(flags=per_head, attention_tp=1), _fp(flags=per_head, attention_tp=8))
    assert exc is not None and "attention-TP size: prefill 1, decode 8" in exc.diagnostic.found


@pytest.mark.parametrize("state", ["NOT_SELECTED", "DISABLED", "FAILED"])
def test_a_patch_that_is_not_on_leaves_the_patch_set(monkeypatch, state):
    """A patch the operator did not select, disabled, or that failed to apply does not run on that side."""
    from types import SimpleNamespace

    from eagle3_patches.registry import State

    registry = SimpleNamespace(status=lambda: {"a": SimpleNamespace(state=State.APPLIED)})
    monkeypatch.setattr(fp, "get_registry", lambda: registry)
    applied = fp.selection()
    assert applied["patches"] == ["a"]
    registry.status = lambda: {"a": SimpleNamespace(state=State[state])}
    assert fp.selection()["patches"] == []


def test_a_release_without_the_metadata_buffers_or_the_decode_commit_is_not_patched():
    from types import SimpleNamespace

    from eagle3_patches.registry import NotApplicable

    class MetadataBuffers:
        def set_buf(self, req):
            pass

    class DecodeTransferQueue:
        def _commit_transfer_to_req(self, decode_req):
            pass

    fp.PATCH.check(SimpleNamespace(MetadataBuffers=MetadataBuffers, DecodeTransferQueue=DecodeTransferQueue))
    for module in (
        SimpleNamespace(MetadataBuffers=object, DecodeTransferQueue=DecodeTransferQueue),
        SimpleNamespace(MetadataBuffers=MetadataBuffers, DecodeTransferQueue=object),
    ):
        with pytest.raises(NotApplicable):
            fp.PATCH.check(module)


def test_a_message_said_once_is_said_once(caplog, monkeypatch):
    monkeypatch.setattr(fp, "_said", set())
    with caplog.at_level(logging.WARNING, logger="eagle3_patches"):
        for _ in range(3):
            fp._say_once("fake", logging.WARNING, "the fake transfer backend moves no bytes")
    assert [r.getMessage() for r in caplog.records].count("the fake transfer backend moves no bytes") == 1


def test_attention_tp_sizes_are_compared_only_for_a_per_head_draft_beside_an_mla_target():
    per_head = fp.SPECULATING | fp.DRAFT_BY_CONTENT | fp.PER_HEAD_DRAFT_KV
    exc = fp.refusal(_fp(flags=per_head, attention_tp=8), _fp(flags=per_head, attention_tp=1))
    assert exc is not None and "attention-TP size: prefill 8, decode 1" in exc.diagnostic.found
    assert fp.refusal(_fp(flags=per_head, attention_tp=8), _fp(flags=per_head, attention_tp=8)) is None
    assert fp.refusal(_fp(attention_tp=8), _fp(attention_tp=1)) is None  # an MLA draft: the KV arrives whole
    assert fp.refusal(_fp(flags=per_head, attention_tp=0), _fp(flags=per_head, attention_tp=1)) is None  # unknown


def test_the_attention_tp_size_and_the_draft_kind_are_read_from_the_server_args(tiny):
    from types import SimpleNamespace

    assert fp._attention_tp(SimpleNamespace(tp_size=8, dp_size=8, enable_dp_attention=True)) == 1
    assert fp._attention_tp(SimpleNamespace(tp_size=8, dp_size=8, enable_dp_attention=False)) == 8
    assert fp._attention_tp(SimpleNamespace(tp_size=8, dp_size=2, enable_dp_attention=True)) == 4

    def args(draft, target=tiny["kimi_k25"]):
        return SimpleNamespace(model_path=str(target), speculative_draft_model_path=str(draft))

    assert fp._per_head_draft_beside_mla(args(tiny["draft"]))
    assert not fp._per_head_draft_beside_mla(args(tiny["mla_draft"]))
    assert not fp._per_head_draft_beside_mla(args("lightseekorg/kimi-k2.5-eagle3"))
    assert fp._per_head_draft_beside_mla(args(tiny["draft"], tiny["deepseek_v3"]))  # DeepSeek-V3 is MLA too


# ------------------------------------------------------------------ what the fingerprint covers
def _selection(environ: dict[str, str]) -> dict:
    settings.reload(environ)
    return fp.selection()


#: every behaviour setting but those that select patches (their effect, the patches on, is what the row carries)
VALUED = [s for s in settings.DECLARED if s.behaviour and s.var not in settings.SELECTING]


@pytest.mark.parametrize("setting", VALUED, ids=[s.var for s in VALUED])
def test_a_behaviour_setting_on_one_side_changes_that_sides_fingerprint(setting, other_value):
    """A layer-id convention (or any other setting that changes what the draft is fed) set on the prefill side only
    gives it another fingerprint: the decode side refuses its rows instead of continuing from them."""
    assert _selection({setting.var: other_value(setting)}) != _selection({})


@pytest.mark.parametrize(
    "environ",
    [
        {settings.PROBE: "1"},
        {settings.WATCHDOG_WINDOW: "50"},
        {settings.WATCHDOG: "0"},
        {settings.DISABLE: "accept_watchdog"},
        {settings.EXPECTED_ACCEPT_LENGTH: "2.5"},
    ],
    ids=lambda e: next(iter(e)),
)
def test_a_side_that_alone_watches_itself_keeps_its_fingerprint(environ):
    """The instruments and their settings change nothing one side sends: a decode side that alone runs the probe or
    another watchdog window serves its pair."""
    assert _selection(environ) == _selection({})


def test_the_decode_side_checks_every_flag_of_the_pair_declaration():
    """The flags the row carries are the declaration's (which the pair doctor compares too), each one refused."""
    mine = _fp()
    for i, flag in enumerate(fp.SPECULATIVE_FLAGS.values()):
        values = list(mine.speculative())
        values[i] += 1
        theirs = _fp(**dict(zip(("topk", "steps", "draft_tokens"), values, strict=True)))
        exc = fp.refusal(theirs, mine)
        assert exc is not None and flag in exc.diagnostic.found


def _slow_transfer(target: str, draft: str) -> dict:
    """One request whose row arrives after the decode side's first poll (the transfer still under way), on stock
    sglang and then with this patch: per run, each commit's return value, the committed token and the abort."""
    from eagle3_patches.selftest.scenarios import apply_patch_set
    from eagle3_patches.testing import sglang_harness as h

    prefill = h.eagle3_server_args(target, draft, disaggregation_mode="prefill")
    decode = h.eagle3_server_args(target, draft, disaggregation_mode="decode")
    out = {}
    for run in ("stock", "patched"):
        if run == "patched":
            apply_patch_set(["disaggregation_fingerprint"])
        polls: list = []
        token, abort, _ = h.pd_commit(prefill, decode, polls=polls)
        out[run] = (polls, token, abort)
    return out


@pytest.mark.sglang
@pytest.mark.runtime_only
@requires_patch("disaggregation_fingerprint")
def test_a_slow_transfer_is_committed_when_its_row_arrives_not_refused_as_unstamped(tiny):
    """sglang (0.5.9) polls the transfer and commits it only once the metadata row is there: a poll that arrives
    first must leave the request waiting, not read the empty row as a prefill server without eagle3-patches."""
    out = run_isolated(_slow_transfer, str(tiny["kimi_k25"]), str(tiny["draft"]))
    polls, token, abort = out["stock"]
    if polls[0] is not False:
        pytest.skip("this release commits a transfer only once its metadata is ready: no poll arrives early")
    assert (polls, token, abort) == ([False, True], 7, None)
    assert out["patched"] == ([False, True], 7, None)
