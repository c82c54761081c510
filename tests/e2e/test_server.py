"""End to end on CPU: the real ``sglang.launch_server`` doing EAGLE-3 speculative decoding.

Servers (tests/e2e/e2e_servers.py, shared with tests/e2e/test_watchdog.py): the target without speculation (the
reference: the server that dumps the hidden states for tests/e2e/test_expected_accept.py), EAGLE3 with the patches
(+ the diagnostic probe), and ``--speculative-algorithm EAGLE`` with the algorithm and fc guards disabled (the
field's symptom); plus one start with the guard on, refused before any model loads.
And the trained draft as the real speculators library (0.9.0) wrote it
(``tools/make_speculators_fixture.py``), served as it is (``speculators_draft_config``).
"""

from __future__ import annotations

import pytest
from e2e_servers import MAX_NEW_TOKENS, PROMPTS, serve_or_fail
from support.releases import sglang_version

from eagle3_patches.checkpoint import layer_ids as L
from eagle3_patches.testing import tiny_models
from eagle3_patches.testing.server import Server, mean_accept_length, speculative_flags

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]

H = tiny_models.HIDDEN


def test_eagle3_greedy_outputs_identical_to_no_speculation(baseline, eagle3):
    for prompt, want, got in zip(PROMPTS, baseline["outputs"], eagle3["outputs"]):
        assert len(want) == MAX_NEW_TOKENS
        assert got == want, f"prompt {prompt}: speculative {got} != plain {want}"


def test_eagle3_accept_length_with_trained_draft(eagle3, figure):
    accept = mean_accept_length(eagle3["responses"])
    per_request = [round(r["meta_info"]["spec_accept_length"], 2) for r in eagle3["responses"]]
    figure(f"EAGLE3, 3 steps, topk 1, {MAX_NEW_TOKENS} new tokens: mean accept length {accept:.2f} {per_request}")
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in eagle3["responses"])
    assert accept >= 2.0


def test_eagle3_draft_fc_received_3h_inputs(eagle3, figure):
    draft_in = [r for r in eagle3["probe"] if r.get("hop") == "draft_input"]
    assert draft_in, "the probe recorded no draft input:\n" + eagle3["log"][-3000:]
    extend = [r for r in draft_in if r.get("fc_applied")]
    assert extend and all(r["width"] == 3 * H for r in extend), draft_in
    shapes = {tuple(r["fc_input_shape"])[-1] for r in extend if r.get("fc_input_shape")}
    assert shapes == {3 * H}, draft_in
    assert "draft_input" in eagle3["log"] and "fc applied" in eagle3["log"]
    figure(
        "probe in the EAGLE3 server: draft fc inputs "
        f"{sorted({tuple(r['fc_input_shape']) for r in extend if r.get('fc_input_shape')})}"
    )
    # the patch status line: every default patch applied in the server's processes
    assert "eagle3_algorithm_guard=applied" in eagle3["log"]


def test_eagle_with_guards_disabled_reproduces_the_symptom(eagle_unguarded, figure):
    accept = mean_accept_length(eagle_unguarded["responses"])
    figure(f"--speculative-algorithm EAGLE with the EAGLE-3 draft (guards disabled): accept length {accept:.2f}")
    assert accept < 1.3


def test_eagle_with_guard_on_is_refused_at_start(models, tmp_path):
    server = Server(models["target"], speculative_flags(models["draft"], "EAGLE"), log_path=tmp_path / "refused.log")
    rc = server.wait_exit(timeout=180)
    log = server.log()
    assert rc not in (0, -9), log[-3000:]
    assert "--speculative-algorithm EAGLE3" in log and "accept length would fall" in log, log[-3000:]
    print("\n" + next(line for line in log.splitlines() if "EAGLE-3 draft" in line))


# --------------------------------------------------------------------------- a speculators-format draft, as it is
@pytest.fixture(scope="module")
def speculators_served(models, tmp_path_factory) -> dict:
    """One server with the speculators directory itself as the draft.  Its conversion is not served again: sglang's
    draft ModelRunner holds the same parameters bit for bit for both (tests/patches/test_speculators_draft_config.py),
    and a draft in sglang's format is what the ``eagle3`` server runs."""
    direct = tiny_models.build_speculators_fixture(tmp_path_factory.mktemp("speculators"))
    out = serve_or_fail(
        "speculators-direct",
        models["target"],
        speculative_flags(str(direct), "EAGLE3"),
        tmp_path_factory.mktemp("direct"),
        PROMPTS,
    )
    return {"path": direct, "direct": out}


def test_speculators_draft_served_directly_predicts(speculators_served, eagle3, figure):
    direct = speculators_served["direct"]
    assert all(len(o) == MAX_NEW_TOKENS for o in direct["outputs"])
    accepts = [round(r["meta_info"]["spec_accept_length"], 2) for r in direct["responses"]]
    accept = mean_accept_length(direct["responses"])
    figure(
        f"the speculators 0.9.0 draft (bf16) served as it is: accept length {accept:.2f} {accepts}; the same draft "
        f"trained in fp32, in sglang's format: {mean_accept_length(eagle3['responses']):.2f}"
    )
    assert accept >= 1.5  # the draft predicts: the aux states reach it from the layers it was trained on


def test_speculators_draft_served_directly_as_the_patch_logs(speculators_served, baseline):
    log = speculators_served["direct"]["log"]
    ids = L.from_output_of_layer(tiny_models.DRAFT_AUX_IDS, L.release_convention(sglang_version()))
    assert "speculators-format EAGLE-3 draft" in log and f"-> {ids}" in log, log[-3000:]
    assert "speculators_draft_config=applied" in log
    assert speculators_served["direct"]["outputs"] == baseline["outputs"]  # greedy: speculation changes nothing
    assert not (speculators_served["path"] / tiny_models.TRIPWIRE_MARK).exists()  # its config.py never ran
