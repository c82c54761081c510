"""disaggregation_fingerprint: the prefill server stamps what it speculates with into the metadata row sglang already
sends per request; the decode server refuses a row that does not match its own, and one without a stamp."""

from __future__ import annotations

import logging

import pytest

from eagle3_patches.patches import disaggregation_fingerprint as fp
from eagle3_patches.selftest import PASSED
from eagle3_patches.selftest.checks.disaggregation_fingerprint import COMMITTED, REFUSED
from eagle3_patches.testing.releases import requires_patch


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
    from types import SimpleNamespace

    def args(path, revision=None):
        return SimpleNamespace(
            speculative_algorithm="EAGLE3",
            speculative_draft_model_path=path,
            speculative_draft_model_revision=revision,
            speculative_eagle_topk=1,
            speculative_num_steps=3,
            speculative_num_draft_tokens=4,
        )

    local = fp.fingerprint_of(args(str(tiny["draft"])))
    hub = fp.fingerprint_of(args("lightseekorg/kimi-k2.5-eagle3"))
    assert local.flags & fp.DRAFT_BY_CONTENT and not hub.flags & fp.DRAFT_BY_CONTENT
    assert fp.fingerprint_of(args("lightseekorg/kimi-k2.5-eagle3")) == hub
    assert fp.fingerprint_of(args("lightseekorg/kimi-k2.5-eagle3", "v2")).draft != hub.draft
    assert not fp.fingerprint_of(SimpleNamespace(speculative_algorithm=None)).speculating


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
