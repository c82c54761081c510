"""A real prefill/decode pair: sglang's disaggregation code on both sides, mooncake's transfer engine over TCP, sglang's
router in front, the tiny Kimi-K2.5 with its trained EAGLE-3 draft, every process under eagle3-patches.

* ``eagle3`` pair (both sides EAGLE3): the outputs of the colocated server without speculation, and the accept length
  of the colocated EAGLE3 server (the draft's state arrives whole);
* a prefill server without speculation behind a decode server with it: each request refused by
  ``disaggregation_fingerprint`` with its reason, instead of served at a lower accept length.
"""

from __future__ import annotations

import urllib.error

import pytest
from e2e_servers import MAX_NEW_TOKENS, PROMPTS

from eagle3_patches.testing.server import DisaggregatedPair, speculative_flags

pytestmark = [pytest.mark.server, pytest.mark.timeout(1500)]
pytest.importorskip("sglang_router", reason="sglang's router (sglang-router, requirements-test.txt) is not installed")
pytest.importorskip(
    "mooncake.engine",
    reason="mooncake's transfer engine does not import (mooncake-transfer-engine-non-cuda, and Debian's libibverbs1: "
    "tools/setup_env.sh)",
    exc_type=ImportError,
)

#: how far the pair's accept length may be from the colocated server's (absolute): the same tokens and the same
#: draft state; what is left is float arithmetic
TOLERANCE = 0.1


def accept_length(responses) -> float:
    """Tokens per verify step over every request (the first token comes from the prefill side in both setups)."""
    return sum(r["meta_info"]["completion_tokens"] for r in responses) / sum(
        r["meta_info"]["spec_verify_ct"] for r in responses
    )


@pytest.fixture(scope="module")
def pair(models, tmp_path_factory) -> dict:
    spec = speculative_flags(models["draft"], "EAGLE3")
    with DisaggregatedPair(models["target"], spec, spec, log_dir=tmp_path_factory.mktemp("pd-eagle3")) as p:
        responses = [p.generate(prompt, MAX_NEW_TOKENS) for prompt in PROMPTS]
        return {"responses": responses, "decode_log": p.decode.log()}


def test_the_pair_gives_the_outputs_of_no_speculation_at_the_colocated_accept_length(pair, baseline, eagle3, figure):
    assert [r["output_ids"] for r in pair["responses"]] == baseline["outputs"]
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in pair["responses"])  # the decode side speculated
    served, colocated = accept_length(pair["responses"]), accept_length(eagle3["responses"])
    figure(
        f"prefill/decode pair (mooncake over TCP, sglang's router), EAGLE3 on both sides, {len(PROMPTS)} prompts x "
        f"{MAX_NEW_TOKENS} tokens: accept length {served:.3f}; the colocated EAGLE3 server: {colocated:.3f}"
    )
    assert abs(served - colocated) <= TOLERANCE
    assert "eagle3-patches: the prefill server" not in pair["decode_log"]  # nothing refused
    assert "fake transfer backend" not in pair["decode_log"]  # the router's health checks are not a fake backend


def test_a_prefill_server_without_speculation_is_refused_by_the_decode_server(models, tmp_path):
    spec = speculative_flags(models["draft"], "EAGLE3")
    with DisaggregatedPair(models["target"], [], spec, log_dir=tmp_path) as p:
        with pytest.raises(urllib.error.HTTPError) as refused:
            p.generate(PROMPTS[0], MAX_NEW_TOKENS)
        body = refused.value.read().decode(errors="replace")
        log = p.decode.log()
    assert refused.value.code == 500
    assert "the prefill server sent no draft state" in body, body[:2000]
    assert "eagle3-patches doctor --prefill CMD --decode CMD" in body
    said = [line for line in log.splitlines() if "the prefill server speculates otherwise" in line]
    assert len(said) == 1, said  # one log line per distinct difference
    assert "prefill: no speculation; decode: topk 1, steps 3, draft tokens 4" in log
