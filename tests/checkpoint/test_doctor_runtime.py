"""What the draft runs with: the doctor compares the context length it is served at with its own (sglang gives the
draft the target's), its RoPE with the target's, and names what it inherits from the target's flags (quantization,
attention backend), each with the flag that fixes it."""

from __future__ import annotations

import pytest

from eagle3_patches.diagnostic import ERROR, INFO, WARNING
from eagle3_patches.doctor import check_draft, doctor
from eagle3_patches.doctor.runtime_checks import ALLOW_LONGER, DEFAULT_CONTEXT_LENGTH, derived_context_length


def run(tiny, *flags: str, draft=None, target=None, **kw):
    launch = ["--speculative-algorithm", "EAGLE3", *flags]
    return doctor(target or tiny["kimi_k25"], draft or tiny["draft"], sglang_version="0.5.9", launch=launch, **kw)


def finding(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report.format()
    return found[0]


# ------------------------------------------------------------------------------------------------ context length
@pytest.mark.parametrize(
    "config, length",
    [
        ({"max_position_embeddings": 4096}, 4096),
        ({"seq_length": 1000, "max_position_embeddings": 4096}, 1000),  # sglang's key order
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 16384),
        (  # the scaling names its original length: the stated length is the scaled one already
            {
                "max_position_embeddings": 262144,
                "rope_scaling": {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
            },
            262144,
        ),
        ({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 8192),
        ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}, 8192),
        ({}, DEFAULT_CONTEXT_LENGTH),
        ({"max_position_embeddings": "4096"}, DEFAULT_CONTEXT_LENGTH),  # hostile: not an int
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": "x"}}, 4096),
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 1e30}}, 4096),
    ],
)
def test_the_context_length_is_derived_as_sglang_derives_it(config, length):
    assert derived_context_length(config) == length


def test_a_draft_as_long_as_the_target_serves_silently(tiny):
    r = run(tiny)
    assert not [f for f in r.findings if f.code in ("draft-context-length", "draft-rope")], r.format()
    assert r.facts["draft_context"] == {"served": 2048, "served_from": "the target's", "draft": 2048}


def test_a_longer_context_length_than_the_draft_is_refused_at_start_naming_the_length(tiny, monkeypatch):
    monkeypatch.delenv(ALLOW_LONGER, raising=False)
    r = run(tiny, "--context-length", "8192")
    f = finding(r, "draft-context-length")
    assert f.severity == ERROR and "sglang refuses to start" in f.what
    assert f.found == "draft 2048 (derived as sglang does), served 8192 (--context-length)"
    assert "--context-length 2048" in f.fix
    assert r.with_patches is not None and "draft-context-length" in r.with_patches.codes(ERROR)  # no patch fixes it
    assert r.format().split("ERROR")[1].startswith("   [draft-context-length]")  # it stops the server: listed first


def test_a_draft_shorter_than_the_target_is_refused_without_any_flag(tiny, make_draft):
    d = make_draft(config={"max_position_embeddings": 1024})
    f = finding(run(tiny, draft=d), "draft-context-length")
    assert f.found == "draft 1024 (derived as sglang does), served 2048 (the target's)"


def test_allowed_longer_it_starts_and_the_doctor_warns_of_the_quiet_loss(tiny, monkeypatch):
    monkeypatch.setenv(ALLOW_LONGER, "1")
    f = finding(run(tiny, "--context-length", "8192"), "draft-context-length")
    assert f.severity == WARNING and "accept length falls as contexts grow" in f.what


# ------------------------------------------------------------------------------------------------ RoPE
@pytest.mark.parametrize(
    "edit",
    [
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}},
        {"rope_theta": 500000.0},
    ],
)
def test_a_draft_rope_unlike_the_targets_is_a_note(tiny, make_draft, edit):
    f = finding(run(tiny, draft=make_draft(config=edit)), "draft-rope")
    assert f.severity == INFO and f.found.startswith("draft: rope_scaling")
    assert f.expected.startswith("the target's: rope_scaling none, rope_theta 10000.0")


#: the target's RoPE as Kimi-K2.5 ships it (YaRN x64 over 4096, theta 50000), and a draft's as a public training
#: framework sets it for this target: its own theta 1e6, no scaling, the target's length
KIMI_TARGET_ROPE = {
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096},
}
KIMI_DRAFT_ROPE = {"max_position_embeddings": 262144, "rope_theta": 1000000.0}


def test_a_kimi_draft_with_its_own_rope_served_within_its_length_is_only_a_note(tiny, make_draft, make_target):
    target = make_target("kimi_k25", config={"text_config": KIMI_TARGET_ROPE})
    r = run(tiny, "--context-length", "131072", draft=make_draft(config=KIMI_DRAFT_ROPE), target=target)
    f = finding(r, "draft-rope")
    assert f.severity == INFO and "within its own length (262144)" in f.what and not f.fix
    assert f.found == "draft: rope_scaling none, rope_theta 1000000.0"
    assert f.expected.startswith("the target's: rope_scaling yarn x64.0, rope_theta 50000.0")
    patched = r.with_patches  # stock 0.5.9's own bugs aside, a correct, common draft: nothing to heed
    assert patched is not None and not patched.codes(WARNING) and not patched.codes(ERROR), r.format()
    at_length = run(tiny, "--context-length", "262144", draft=make_draft(config=KIMI_DRAFT_ROPE), target=target)
    assert "within its own length (262144)" in finding(at_length, "draft-rope").what  # its whole length is within


def test_a_draft_with_its_own_rope_served_past_its_length_points_at_the_length_finding(
    tiny, make_draft, make_target, monkeypatch
):
    monkeypatch.setenv(ALLOW_LONGER, "1")
    target = make_target("kimi_k25", config={"text_config": KIMI_TARGET_ROPE})
    draft = make_draft(config={**KIMI_DRAFT_ROPE, "max_position_embeddings": 4096})
    r = run(tiny, "--context-length", "131072", draft=draft, target=target)
    assert finding(r, "draft-context-length").severity == WARNING  # the one warning, where the outcome changes
    f = finding(r, "draft-rope")
    assert f.severity == INFO and "passes its own length (4096)" in f.what and "[draft-context-length]" in f.fix


def test_a_yarn_factor_of_one_is_no_scaling(tiny, make_draft):
    d = make_draft(config={"rope_scaling": {"rope_type": "yarn", "factor": 1.0}})
    assert "draft-rope" not in run(tiny, draft=d).codes()


# ------------------------------------------------------------------------------------------------ inherited flags
def test_an_inherited_quantization_is_a_warning_with_the_flag_that_stops_it(tiny):
    f = finding(run(tiny, "--quantization", "fp8"), "draft-quantization-inherited")
    assert f.severity == WARNING and f.fix == "add --speculative-draft-model-quantization unquant"


@pytest.mark.parametrize(
    "flags, quant, source",
    [
        (["--quantization", "fp8", "--speculative-draft-model-quantization", "unquant"], None, "--speculative-draft"),
        (["--quantization", "fp8", "--speculative-draft-model-quantization", "fp8"], "fp8", "--speculative-draft"),
        ([], None, "none given"),
    ],
)
def test_a_quantization_the_draft_was_given_is_stated_not_warned(tiny, flags, quant, source):
    r = run(tiny, *flags)
    assert "draft-quantization-inherited" not in r.codes()
    runs = r.facts["draft_runs_with"]
    assert runs["quantization"] == quant and runs["quantization_from"].startswith(source)


def test_a_quantized_draft_inheriting_the_quantization_is_not_warned(tiny, make_draft):
    d = make_draft(config={"quantization_config": {"quant_method": "fp8"}})
    assert "draft-quantization-inherited" not in run(tiny, "--quantization", "fp8", draft=d).codes()


@pytest.mark.parametrize("backend", ["trtllm_mla", "flashmla", "cutlass_mla"])
def test_an_mla_only_backend_inherited_by_the_draft_is_a_warning(tiny, backend):
    f = finding(run(tiny, "--attention-backend", backend), "draft-attention-backend")
    assert f.severity == WARNING and "--speculative-draft-attention-backend" in f.fix


@pytest.mark.parametrize(
    "flags",
    [
        ["--attention-backend", "trtllm_mla", "--speculative-draft-attention-backend", "fa3"],
        ["--attention-backend", "fa3"],
    ],
)
def test_a_draft_backend_that_serves_it_is_silent(tiny, flags):
    assert "draft-attention-backend" not in run(tiny, *flags).codes()


def test_the_doctor_states_what_the_draft_runs_with(tiny):
    f = finding(run(tiny, "--quantization", "fp8", "--attention-backend", "trtllm_mla"), "draft-runs-with")
    assert f.severity == INFO
    assert f.what == (
        "the draft runs with quantization fp8 (--quantization (inherited)), dtype bfloat16 (config dtype bfloat16), "
        "attention backend trtllm_mla (--attention-backend (inherited)), context length 2048"
    )
    f = finding(run(tiny, "--dtype", "float16"), "draft-runs-with")
    assert "dtype float16 (--dtype float16)" in f.what


def test_the_converters_check_of_a_draft_judges_no_launch(tiny, make_draft):
    r = check_draft(
        make_draft(config={"max_position_embeddings": 1024}), target=tiny["kimi_k25"], sglang_version="0.5.9"
    )
    assert not {"draft-context-length", "draft-runs-with"} & set(r.codes())


@pytest.mark.parametrize("value, severity", [("TRUE", WARNING), ("Y", WARNING), ("0", ERROR), ("on", ERROR)])
def test_the_allow_longer_setting_is_read_as_sglangs_envbool_reads_it(tiny, monkeypatch, value, severity):
    monkeypatch.setenv(ALLOW_LONGER, value)
    assert finding(run(tiny, "--context-length", "8192"), "draft-context-length").severity == severity


def test_a_hostile_rope_value_is_shown_bounded(tiny, make_draft):
    d = make_draft(config={"rope_theta": "9" * 10_000, "rope_scaling": {"rope_type": "x" * 10_000, "factor": 2.0}})
    f = finding(run(tiny, draft=d), "draft-rope")
    assert len(f.found) < 200


# ------------------------------------------------------------------------------------------------ expected figure
FIGURE = {
    "accept_length": 3.1,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}
SHAPE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_no_expected_figure_no_finding(tiny, monkeypatch):
    monkeypatch.delenv("EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH", raising=False)
    assert "expected-accept-length" not in run(tiny, *SHAPE).codes()


def test_the_expected_figure_at_the_served_flags_is_stated(tiny, make_draft):
    d = make_draft(config={"expected_accept_length": FIGURE})
    f = finding(run(tiny, *SHAPE, draft=d), "expected-accept-length")
    assert f.severity == INFO and "the expected 3.1 at --speculative-num-steps 3" in f.what
    assert "config.json: expected_accept_length" in f.what  # where it came from


def test_an_expected_figure_measured_at_other_flags_is_a_warning(tiny, make_draft):
    d = make_draft(config={"expected_accept_length": FIGURE})
    f = finding(
        run(tiny, "--speculative-num-steps", "5", "--speculative-num-draft-tokens", "6", draft=d),
        "expected-accept-length",
    )
    assert f.severity == WARNING and f.found == "measured at --speculative-num-steps 3, served with 5"
    assert "measure-accept" in f.fix


def test_under_adaptive_steps_the_doctor_says_the_watchdog_judges_nothing(tiny, make_draft):
    d = make_draft(config={"expected_accept_length": FIGURE})
    r = doctor(
        tiny["kimi_k25"],
        d,
        sglang_version="0.5.13",
        launch=["--speculative-algorithm", "EAGLE3", *SHAPE, "--speculative-adaptive"],
    )
    f = finding(r, "speculative-adaptive")
    assert f.severity == INFO and f.where == "--speculative-adaptive"
    assert "judges no accept length" in f.what and "down to 0, no drafting" in f.what
    assert "expected-accept-length" not in r.codes()  # no comparison promised that the watchdog will not make
    assert "speculative-adaptive" not in run(tiny, *SHAPE, draft=d).codes()


@pytest.mark.parametrize(
    "flag",
    ["--enable-dp-attention", "--enable-two-batch-overlap", "--enable-multi-layer-eagle", "--enable-pdmux"],
)
def test_where_sglang_runs_fixed_steps_under_adaptive_the_doctor_says_the_watchdog_judges(tiny, make_draft, flag):
    """Each flag on which sglang falls back to fixed steps (its adaptive_unsupported_reason): the doctor names it
    and keeps the expected figure's comparison, which the watchdog makes there."""
    d = make_draft(config={"expected_accept_length": FIGURE})
    launch = ["--speculative-algorithm", "EAGLE3", *SHAPE, "--speculative-adaptive", flag]
    f = finding(doctor(tiny["kimi_k25"], d, sglang_version="0.5.23", launch=launch), "speculative-adaptive")
    assert f.severity == INFO and f"turns --speculative-adaptive off for this launch ({flag})" in f.what
    assert "judges no accept length" not in f.what


def test_adaptive_steps_on_a_release_without_the_flag_is_an_error(tiny, make_draft):
    d = make_draft(config={"expected_accept_length": FIGURE})
    launch = ["--speculative-algorithm", "EAGLE3", *SHAPE, "--speculative-adaptive"]
    f = finding(doctor(tiny["kimi_k25"], d, sglang_version="0.5.10.post1", launch=launch), "speculative-adaptive")
    assert f.severity == ERROR and f.where == "--speculative-adaptive"
    assert (
        f.found == "sglang 0.5.10" and f.expected == "sglang 0.5.11 or later" and "drop --speculative-adaptive" in f.fix
    )
    on_011 = finding(doctor(tiny["kimi_k25"], d, sglang_version="0.5.11", launch=launch), "speculative-adaptive")
    assert on_011.severity == INFO  # the first release with the flag: what the watchdog does under it


def test_where_sglang_turns_adaptive_steps_off_the_doctor_says_the_watchdog_judges(tiny, make_draft):
    d = make_draft(config={"expected_accept_length": FIGURE})
    launch = ["--speculative-algorithm", "EAGLE3", *SHAPE, "--speculative-adaptive", "--enable-dp-attention"]
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.13", launch=launch)
    f = finding(r, "speculative-adaptive")
    assert "turns --speculative-adaptive off for this launch (--enable-dp-attention)" in f.what
    assert finding(r, "expected-accept-length").severity == INFO  # compared as at any fixed steps


def test_a_malformed_expected_figure_is_a_warning_naming_the_field(tiny, make_draft):
    d = make_draft(config={"expected_accept_length": {"accept_length": 0.9}})
    f = finding(run(tiny, *SHAPE, draft=d), "expected-accept-length")
    assert f.severity == WARNING and f.found == "accept_length 0.9" and f.where.endswith("expected_accept_length")


def test_the_launchs_figure_wins_over_the_configs(tiny, make_draft, monkeypatch):
    monkeypatch.delenv("EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH", raising=False)
    d = make_draft(config={"expected_accept_length": FIGURE})
    launch = ["EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH=2.5", "python", "-m", "sglang.launch_server", *SHAPE]
    r = doctor(tiny["kimi_k25"], d, sglang_version="0.5.9", launch=[*launch, "--speculative-algorithm", "EAGLE3"])
    f = finding(r, "expected-accept-length")
    assert f.severity == INFO
    assert "the expected 2.5, at a temperature not stated (EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH)" in f.what
    # the launch's temperature of its figure is said with it (the watchdog compares windows served at it)
    r = doctor(
        tiny["kimi_k25"],
        d,
        sglang_version="0.5.9",
        launch=["EAGLE3_PATCHES_EXPECTED_ACCEPT_TEMPERATURE=0.6", *launch, "--speculative-algorithm", "EAGLE3"],
    )
    assert (
        "the expected 2.5, temperature 0.6 (EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH)"
        in finding(r, "expected-accept-length").what
    )
    monkeypatch.setenv("EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH", "seventy")
    f = finding(run(tiny, *SHAPE), "expected-accept-length")
    assert f.severity == WARNING and "'seventy'" in f.found
