"""The doctor on a disaggregated prefill/decode pair (``eagle3-patches doctor --prefill CMD --decode CMD``): silent
on a pair that agrees, each disagreement named with both sides, each side's own findings kept with its side."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from eagle3_patches import settings
from eagle3_patches.checkpoint.digest import checkpoint_digest
from eagle3_patches.diagnostic import ERROR, WARNING
from eagle3_patches.doctor import doctor_pair
from eagle3_patches.patches import disaggregation_fingerprint as fingerprint


def launch(tiny, side: str, *extra: str, draft=None, env: str = "", wrapped: bool = True) -> str:
    cmd = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tiny["kimi_k25"]),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(draft or tiny["draft"]),
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
        "--disaggregation-mode",
        side,
        "--tp",
        "2",
        *extra,
    ]
    return (env + " " if env else "") + ("eagle3-patches run -- " if wrapped else "") + shlex.join(cmd)


def pair(tiny, prefill: str, decode: str, **kw):
    return doctor_pair(prefill, decode, sglang_version="0.5.23", **kw)


def codes(report) -> set[str]:
    return set(report.pair.codes())


def only(report, code: str):
    (f,) = [f for f in report.pair.findings if f.code == code]
    return f


def without(cmd: str, *flags: str) -> str:
    """``cmd`` with each flag in ``flags`` and its value removed."""
    argv = shlex.split(cmd)
    for flag in flags:
        i = argv.index(flag)
        del argv[i : i + 2]
    return shlex.join(argv)


def test_a_pair_that_agrees_has_no_pair_finding(tiny):
    r = pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode"))
    assert r.pair.findings == [], r.format()
    assert r.ok == (r.prefill.ok and r.decode.ok)


def test_the_same_draft_under_two_paths_is_the_same_draft(tiny, tmp_path):
    copy = shutil.copytree(tiny["draft"], tmp_path / "copy")
    r = pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", draft=copy))
    assert "pd-draft" not in codes(r), r.format()


def test_another_draft_on_the_decode_side_is_refused_naming_both(tiny, make_draft):
    import re

    import torch

    other = make_draft("other", tensors=lambda t: t.update({"fc.weight": t["fc.weight"] + torch.ones(())}))
    f = only(pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", draft=other)), "pd-draft")
    assert f.severity == ERROR and str(tiny["draft"]) in f.found and str(other) in f.found
    for prefill, decode in ((tiny["draft"], other), (other, tiny["draft"])):  # either side's the other draft
        f = only(pair(tiny, launch(tiny, "prefill", draft=prefill), launch(tiny, "decode", draft=decode)), "pd-draft")
        shown = re.findall(r"sha256 ([0-9a-f]+)\)", f.found)
        assert shown == [checkpoint_digest(prefill, "draft")[:16], checkpoint_digest(decode, "draft")[:16]], f.found


@pytest.mark.parametrize(
    "edit, code, severity",
    [
        (lambda c: c.replace("EAGLE3", "EAGLE", 1), "pd-algorithm", ERROR),
        (
            lambda c: c.replace("--speculative-eagle-topk 1", "--speculative-eagle-topk 4"),
            "pd-speculative-flags",
            ERROR,
        ),
        (lambda c: c.replace("--speculative-num-steps 3", "--speculative-num-steps 5"), "pd-speculative-flags", ERROR),
        (lambda c: c + " --page-size 64", "pd-page-size", WARNING),
        (lambda c: c + " --kv-cache-dtype fp8_e4m3", "pd-kv-cache-dtype", ERROR),
        (lambda c: c + " --disaggregation-transfer-backend nixl", "pd-transfer-backend", ERROR),
        (lambda c: c + " --context-length 8192", "pd-context-length", WARNING),
        (lambda c: "SGLANG_ENABLE_SPEC_V2=0 " + c, "pd-spec-v2", ERROR),  # 0.5.23's default is on
        (lambda c: "EAGLE3_PATCHES_DISABLE=eagle3_fc_guard " + c, "pd-patch-set", ERROR),
        (lambda c: c.replace("eagle3-patches run -- ", ""), "pd-patches", ERROR),
        (lambda c: c.replace("--disaggregation-mode decode", "--disaggregation-mode prefill"), "pd-mode", ERROR),
        (lambda c: without(c, "--disaggregation-mode"), "pd-mode", ERROR),
    ],
    ids=[
        "algorithm",
        "topk",
        "steps",
        "page-size-one-side",
        "kv-dtype",
        "backend",
        "context",
        "spec-v2",
        "patch-set",
        "unpatched-decode",
        "two-prefills",
        "colocated-decode",
    ],
)
def test_each_disagreement_is_named_with_both_sides(tiny, edit, code, severity):
    r = pair(tiny, launch(tiny, "prefill"), edit(launch(tiny, "decode")))
    assert codes(r) == {code}, r.format()
    f = only(r, code)
    assert f.severity == severity
    assert ("prefill" in f.found and "decode" in f.found) or f.where.startswith(("decode:", "prefill:")), f


def test_page_sizes_given_on_both_sides_and_different_are_refused(tiny):
    r = pair(tiny, launch(tiny, "prefill", "--page-size", "1"), launch(tiny, "decode", "--page-size", "64"))
    assert only(r, "pd-page-size").severity == ERROR


def test_a_prefill_server_without_speculation_is_refused_and_the_zero_row_said(tiny):
    prefill = launch(tiny, "prefill")
    for flag in ("--speculative-algorithm", "--speculative-draft-model-path"):
        prefill = without(prefill, flag)
    r = pair(tiny, prefill, launch(tiny, "decode"))
    f = only(r, "pd-algorithm")
    assert f.severity == ERROR and "zero metadata row" in f.what and f.where.startswith("prefill")
    back = pair(tiny, launch(tiny, "prefill"), without(launch(tiny, "decode"), "--speculative-algorithm"))
    assert only(back, "pd-algorithm").severity == WARNING  # the draft's work wasted, nothing served wrong


DP_DECODE = ("--dp-size", "2", "--enable-dp-attention")


def test_an_mla_target_with_a_llama_draft_across_attention_tp_sizes_is_refused(tiny):
    r = pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", *DP_DECODE))
    f = only(r, "pd-draft-kv-split")
    assert f.found == "prefill attention-TP size 2; decode attention-TP size 1"
    assert "Eagle3DeepseekV2ForCausalLM" in f.fix


@pytest.mark.parametrize("case", ["mla-draft", "same-attention-tp", "dp-without-dp-attention"])
def test_the_draft_kv_split_is_silent_where_the_kv_arrives_whole(tiny, case):
    draft = tiny["mla_draft"] if case == "mla-draft" else None
    decode = {
        "mla-draft": DP_DECODE,
        "same-attention-tp": ("--dp-size", "1", "--enable-dp-attention"),
        "dp-without-dp-attention": ("--dp-size", "2"),
    }[case]
    r = pair(tiny, launch(tiny, "prefill", draft=draft), launch(tiny, "decode", *decode, draft=draft))
    assert "pd-draft-kv-split" not in codes(r), r.format()


def test_each_sides_own_findings_stay_with_their_side(tiny):
    r = pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode").replace("--tp 2", "--tp 8"))
    assert "tp-draft-split" in r.decode.codes() and "tp-draft-split" not in r.prefill.codes()
    text = r.format()
    assert text.index("the decode server") < text.index("[tp-draft-split]") < text.index("must agree on")
    assert r.exit_code == 1


def test_the_digest_reads_every_weight_file_and_refuses_a_link_out(tiny, tmp_path, link_file):
    copy = shutil.copytree(tiny["draft"], tmp_path / "copy")
    assert checkpoint_digest(copy) == checkpoint_digest(tiny["draft"])
    shard = copy / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor: past every header
    shard.write_bytes(bytes(data))
    assert checkpoint_digest(copy) != checkpoint_digest(tiny["draft"])
    outside = tmp_path / "outside.safetensors"
    shard.rename(outside)
    shard.symlink_to(outside)
    from eagle3_patches.checkpoint.safe_io import CheckpointError

    with pytest.raises(CheckpointError):
        checkpoint_digest(copy)
    r = pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", draft=copy))
    assert "pd-draft" not in codes(r) and not r.decode.ok  # the decode side's report names the link


def test_the_cli_judges_a_pair_and_refuses_half_of_one(tiny, cli):
    p, d = launch(tiny, "prefill"), launch(tiny, "decode").replace("topk 1", "topk 2")
    rc, out, _ = cli("doctor", "--sglang-version", "0.5.23", "--prefill", p, "--decode", d, "--json")
    got = json.loads(out)
    assert rc == 1 and set(got) == {"ok", "exit_code", "prefill", "decode", "pair"}
    assert [f["code"] for f in got["pair"]["findings"]] == ["pd-speculative-flags"]
    rc, _, err = cli("doctor", "--prefill", p)
    assert rc == 2 and "needs both --prefill and --decode" in err
    rc, _, err = cli("doctor", "--prefill", p, "--decode", d, "--target", str(tiny["kimi_k25"]))
    assert rc == 2 and "--target belong in each side's launch command" in err
    rc, _, err = cli("doctor", "--prefill", p, "--decode", "python -m nothing")
    assert rc == 2 and "unrecognised launch command" in err


def test_another_target_config_is_refused_and_a_copy_is_not(tiny, make_target):
    copy = make_target("kimi_k25", name="copy")
    other = make_target("kimi_k25", config={"text_config": {"num_hidden_layers": 5}}, name="other")
    p = launch(tiny, "prefill")
    same = pair(tiny, p, launch(tiny, "decode").replace(str(tiny["kimi_k25"]), str(copy)))
    assert "pd-target" not in codes(same), same.format()
    f = only(pair(tiny, p, launch(tiny, "decode").replace(str(tiny["kimi_k25"]), str(other))), "pd-target")
    assert f.severity == ERROR and str(other) in f.found


def test_the_fake_backend_on_the_prefill_side_is_refused(tiny):
    fake = ("--disaggregation-transfer-backend", "fake")
    f = only(pair(tiny, launch(tiny, "prefill", *fake), launch(tiny, "decode", *fake)), "pd-transfer-backend")
    assert f.severity == ERROR and "moves no bytes" in f.what and f.where.startswith("prefill")


def test_every_pair_code_is_in_the_doctors_page():
    import re
    from pathlib import Path

    from eagle3_patches.doctor import pair as module

    emitted = set(re.findall(r'"(pd-[a-z0-9-]+)"', Path(module.__file__).read_text()))
    page = (Path(__file__).parents[2] / "docs" / "doctor.md").read_text()
    assert emitted and all(f"`{code}`" in page for code in emitted), emitted


def test_the_sampled_digest_reads_a_bounded_part_and_tells_two_trainings_apart(tmp_path):
    """What a serving process fingerprints its draft with: the head and ``blocks`` blocks of each weight file."""
    import torch
    from safetensors.torch import save_file

    from eagle3_patches.checkpoint import digest
    from eagle3_patches.checkpoint.safetensors_header import bytes_read

    def draft(name: str, seed: int):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text("{}")
        save_file({"w": torch.randn(1 << 20, generator=torch.Generator().manual_seed(seed))}, str(d / "m.safetensors"))
        return d

    a, b, copy = draft("a", 1), draft("b", 2), draft("copy", 1)
    before = bytes_read()
    sampled = digest.checkpoint_digest(a, blocks=8)
    read = bytes_read() - before
    assert read <= len(b"{}") + digest.HEAD + 8 * digest.BLOCK < (4 << 20) // 8  # an eighth of the 4 MB file
    assert sampled == digest.checkpoint_digest(copy, blocks=8) != digest.checkpoint_digest(b, blocks=8)
    assert sampled != digest.checkpoint_digest(a)  # a sampled digest is compared only with a sampled one


def test_spec_v2_is_compared_as_each_release_resolves_it(tiny):
    """Unset is the release's default: on from 0.5.11, off before."""
    on = "SGLANG_ENABLE_SPEC_V2=1 "
    assert "pd-spec-v2" not in codes(pair(tiny, launch(tiny, "prefill"), on + launch(tiny, "decode")))
    old = doctor_pair(launch(tiny, "prefill"), on + launch(tiny, "decode"), sglang_version="0.5.9")
    f = only(old, "pd-spec-v2")
    assert "prefill: spec v2 off" in f.found and "decode: spec v2 on" in f.found


# ------------------------------------------------------------------ what a pair must agree on, and nothing more
def test_draft_tokens_4_and_8_with_topk_1_and_3_steps_are_the_same_setting(tiny):
    """With topk 1 sglang sets the draft tokens to steps + 1 on both sides, whatever each launch gave."""
    decode = launch(tiny, "decode").replace("--speculative-num-draft-tokens 4", "--speculative-num-draft-tokens 8")
    r = pair(tiny, launch(tiny, "prefill"), decode)
    assert "pd-speculative-flags" not in codes(r), r.format()
    assert "pd-speculative-flags" not in codes(
        pair(tiny, launch(tiny, "prefill"), without(decode, "--speculative-num-draft-tokens"))
    )


def test_draft_tokens_that_sglang_keeps_are_compared(tiny):
    """With a tree (topk 2) sglang keeps the draft tokens given: 4 against 8 differ, and one side leaving them to
    sglang is a warning."""

    def tree(side: str, tokens: str | None) -> str:
        cmd = launch(tiny, side).replace("--speculative-eagle-topk 1", "--speculative-eagle-topk 2")
        if tokens is None:
            return without(cmd, "--speculative-num-draft-tokens")
        return cmd.replace("--speculative-num-draft-tokens 4", f"--speculative-num-draft-tokens {tokens}")

    f = only(pair(tiny, tree("prefill", "4"), tree("decode", "8")), "pd-speculative-flags")
    assert f.severity == ERROR and f.found == "prefill: 4; decode: 8"
    assert only(pair(tiny, tree("prefill", "4"), tree("decode", None)), "pd-speculative-flags").severity == WARNING


def test_a_decode_side_that_alone_adapts_its_steps_is_fine(tiny):
    """``--speculative-adaptive`` changes the decode side's own steps only; the prefill side sends the same row."""
    r = pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode") + " --speculative-adaptive")
    assert not codes(r), r.format()


@pytest.mark.parametrize(("prefill", "decode"), [("bf16", "bfloat16"), ("auto", "bf16"), ("bfloat16", "auto")])
def test_kv_cache_dtypes_spelt_two_ways_are_one_dtype_on_a_bfloat16_target(tiny, prefill, decode):
    """``bf16`` and ``bfloat16`` are one dtype to sglang, and ``auto`` is the target's (bfloat16 here)."""
    r = pair(
        tiny,
        launch(tiny, "prefill", "--kv-cache-dtype", prefill),
        launch(tiny, "decode", "--kv-cache-dtype", decode),
    )
    assert "pd-kv-cache-dtype" not in codes(r), r.format()


def test_kv_cache_dtype_auto_on_a_float16_target_is_not_bf16(tiny, make_target):
    half = make_target("kimi_k25", config={"torch_dtype": "float16", "text_config": {"torch_dtype": "float16"}})

    def side(name: str, *extra: str) -> str:
        return launch(tiny, name, *extra).replace(str(tiny["kimi_k25"]), str(half))

    f = only(pair(tiny, side("prefill"), side("decode", "--kv-cache-dtype", "bf16")), "pd-kv-cache-dtype")
    assert f.severity == ERROR and "float16" in f.found and "bfloat16" in f.found


def test_kv_cache_dtype_auto_is_a_warning_where_the_targets_quantization_may_choose_fp8(tiny, make_target):
    fp8 = make_target(
        "kimi_k25", config={"quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}}
    )

    def side(name: str, *extra: str) -> str:
        return launch(tiny, name, *extra).replace(str(tiny["kimi_k25"]), str(fp8))

    f = only(pair(tiny, side("prefill"), side("decode", "--kv-cache-dtype", "bf16")), "pd-kv-cache-dtype")
    assert f.severity == WARNING and "quantization config decides" in f.found


def test_disable_lists_in_another_order_are_one_patch_set(tiny):
    names = "eagle3_fc_guard,kimi_k25_eagle3_delegation"
    r = pair(
        tiny,
        launch(tiny, "prefill", env=f"EAGLE3_PATCHES_DISABLE={names}"),
        launch(tiny, "decode", env="EAGLE3_PATCHES_DISABLE=' kimi_k25_eagle3_delegation;eagle3_fc_guard'"),
    )
    assert "pd-patch-set" not in codes(r), r.format()


@pytest.mark.parametrize(
    "env",
    [
        "EAGLE3_PATCHES_PROBE=1",
        "EAGLE3_PATCHES_WATCHDOG_WINDOW=50",
        "EAGLE3_PATCHES_WATCHDOG=0",
        "EAGLE3_PATCHES_DISABLE=accept_watchdog",
        "EAGLE3_PATCHES_ENABLE=eagle3_probe",
        "EAGLE3_PATCHES_EXPECTED_ACCEPT_LENGTH=2.5",
    ],
)
def test_a_decode_side_that_alone_sets_an_instrument_is_fine(tiny, env):
    """The watchdog, the probe and their settings watch the decode side; they change nothing the prefill side
    sends, so they are not part of what the pair must share."""
    r = pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", env=env))
    assert "pd-patch-set" not in codes(r), r.format()


#: every behaviour setting but those that select patches (their effect, the patches on, is compared)
VALUED = [s for s in settings.DECLARED if s.behaviour and s.var not in settings.SELECTING]


@pytest.mark.parametrize("setting", VALUED, ids=[s.var for s in VALUED])
def test_a_behaviour_setting_on_one_side_only_is_named(tiny, setting, other_value):
    f = only(
        pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", env=f"{setting.var}={other_value(setting)}")),
        "pd-patch-set",
    )
    assert f.severity == ERROR and setting.var in f.found and "prefill" in f.found and "decode" in f.found
    if setting.var == settings.LAYER_ID_CONVENTION:  # its default is no value: said as such
        assert f"prefill {setting.var} unset" in f.found and f"decode {setting.var} unset" not in f.found, f.found


@pytest.mark.parametrize(
    ("decode", "wrapped", "named"),
    [
        ("EAGLE3_PATCHES_DISABLE=eagle3_fc_guard", True, "prefill alone eagle3_fc_guard; decode alone none"),
        # the plugin's way in (no `eagle3-patches run`, which sets the variable itself): the list selects the patches
        ("EAGLE3_PATCHES_APPLY=eagle3_fc_guard", False, "kimi_k25_eagle3_delegation"),
        ("EAGLE3_PATCHES_DISABLE=all", True, "kimi_k25_eagle3_delegation"),
    ],
)
def test_another_patch_set_on_one_side_is_named_by_the_patches_it_changes(tiny, decode, wrapped, named):
    r = doctor_pair(
        launch(tiny, "prefill", wrapped=wrapped),
        launch(tiny, "decode", env=decode, wrapped=wrapped),
        sglang_version="0.5.23",
        with_patches=True,
    )
    f = only(r, "pd-patch-set")
    assert f.found.startswith("the patches on: prefill alone ") and named in f.found, f.found


def test_run_disable_on_one_side_is_another_patch_set(tiny):
    """``eagle3-patches run --disable NAME`` sets the launched server's ``EAGLE3_PATCHES_DISABLE``."""
    decode = launch(tiny, "decode").replace(
        "eagle3-patches run -- ", "eagle3-patches run --disable eagle3_fc_guard -- "
    )
    assert "eagle3_fc_guard" in only(pair(tiny, launch(tiny, "prefill"), decode), "pd-patch-set").found
    same = launch(tiny, "prefill").replace("eagle3-patches run -- ", "eagle3-patches run --disable=eagle3_fc_guard -- ")
    assert "pd-patch-set" not in codes(pair(tiny, same, decode))


def test_the_pair_doctor_compares_the_speculative_flags_the_fingerprint_carries(tiny):
    """One declaration: every flag of the fingerprint's, and only those, changes the pair doctor's verdict."""
    cases = {
        "speculative_eagle_topk": ("--speculative-eagle-topk 1", "--speculative-eagle-topk 2"),
        "speculative_num_steps": ("--speculative-num-steps 3", "--speculative-num-steps 4"),
        "speculative_num_draft_tokens": None,  # with topk 1, derived from the steps (shown above)
    }
    assert set(cases) == set(fingerprint.SPECULATIVE_FLAGS)
    for field, change in cases.items():
        if change is None:
            continue
        f = only(pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode").replace(*change)), "pd-speculative-flags")
        assert f.where == fingerprint.SPECULATIVE_FLAGS[field]


def test_an_empty_or_unbalanced_side_is_a_usage_error_naming_it(tiny, cli):
    d = launch(tiny, "decode")
    rc, _, err = cli("doctor", "--prefill", "", "--decode", d)
    assert rc == 2 and "the prefill server's launch command is empty" in err
    rc, _, err = cli("doctor", "--prefill", launch(tiny, "prefill"), "--decode", d + " --model-path 'unclosed")
    assert rc == 2 and "the decode server's launch command" in err and "No closing quotation" in err
    assert "quote the decode server's command as one argument" in err


# ------------------------------------------------------------------ what each finding says, both ways round
def test_a_side_launched_as_the_other_side_or_colocated_is_named_with_what_it_runs_as(tiny):
    swapped = pair(tiny, launch(tiny, "decode"), launch(tiny, "decode"))
    f = only(swapped, "pd-mode")
    assert f.where == "prefill: --disaggregation-mode" and f.found == "decode"
    colocated = only(
        pair(tiny, launch(tiny, "prefill"), without(launch(tiny, "decode"), "--disaggregation-mode")), "pd-mode"
    )
    assert colocated.found == "not given (colocated)"


def test_the_topk_finding_says_what_the_two_sides_disagree_on(tiny):
    topk = only(
        pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode").replace("topk 1", "topk 2")), "pd-speculative-flags"
    )
    assert "the draft's top-k the prefill side sends" in topk.what
    steps = only(
        pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode").replace("steps 3", "steps 4")),
        "pd-speculative-flags",
    )
    assert steps.what == "--speculative-num-steps differs between the two sides (as sglang sets it)"


def test_draft_tokens_are_compared_where_one_side_builds_a_tree(tiny):
    """With topk 1 on one side only, the draft tokens do not follow from the steps on both: each is named."""
    tree = launch(tiny, "decode").replace("topk 1", "topk 2").replace("draft-tokens 4", "draft-tokens 8")
    r = pair(tiny, launch(tiny, "prefill"), tree)
    wheres = {f.where for f in r.pair.findings if f.code == "pd-speculative-flags"}
    assert wheres == {"--speculative-eagle-topk", "--speculative-num-draft-tokens"}, r.format()


def test_a_prefill_side_without_eagle3_patches_is_named(tiny):
    f = only(pair(tiny, launch(tiny, "prefill", wrapped=False), launch(tiny, "decode")), "pd-patches")
    assert f.where == "prefill: the launch command" and "the prefill side lacks" in f.what


def test_the_settings_of_a_side_without_eagle3_patches_change_nothing(tiny):
    unpatched = launch(tiny, "decode", env="EAGLE3_PATCHES_DISABLE=eagle3_fc_guard", wrapped=False)
    assert codes(pair(tiny, launch(tiny, "prefill"), unpatched)) == {"pd-patches"}


def test_a_prefill_side_without_speculation_is_one_finding_naming_none(tiny):
    prefill = launch(tiny, "prefill")
    for flag in ("--speculative-algorithm", "--speculative-draft-model-path", *fingerprint.SPECULATIVE_FLAGS.values()):
        prefill = without(prefill, flag)
    r = pair(tiny, prefill, launch(tiny, "decode"))
    assert codes(r) == {"pd-algorithm"}, r.format()  # its speculative flags are not compared: it has none
    assert only(r, "pd-algorithm").found == (
        "prefill --speculative-algorithm none; decode --speculative-algorithm EAGLE3"
    )
    back = only(
        pair(tiny, launch(tiny, "prefill"), without(launch(tiny, "decode"), "--speculative-algorithm")), "pd-algorithm"
    )
    assert back.found == "prefill --speculative-algorithm EAGLE3; decode --speculative-algorithm none"


def test_a_side_without_a_draft_or_a_target_path_is_left_to_its_own_report(tiny):
    """No crash and no pair finding of what one side lacks: its own report says it is missing."""
    no_draft = without(launch(tiny, "prefill"), "--speculative-draft-model-path")
    r = pair(tiny, no_draft, launch(tiny, "decode", *DP_DECODE))
    assert not codes(r) & {"pd-draft", "pd-draft-kv-split"}, r.format()
    no_target = without(launch(tiny, "decode"), "--model-path")
    assert "pd-target" not in codes(pair(tiny, launch(tiny, "prefill"), no_target))


def test_a_checkpoint_that_cannot_be_read_is_left_to_its_sides_report(tiny, make_target):
    broken = make_target("kimi_k25")
    (broken / "config.json").write_text("{not json")

    def side(name: str, *extra: str) -> str:
        return launch(tiny, name, *extra).replace(str(tiny["kimi_k25"]), str(broken))

    r = pair(tiny, side("prefill"), launch(tiny, "decode", *DP_DECODE))
    assert not codes(r) & {"pd-target", "pd-draft-kv-split"}, r.format()
    kv = only(
        pair(tiny, side("prefill", "--kv-cache-dtype", "auto"), side("decode", "--kv-cache-dtype", "bf16")),
        "pd-kv-cache-dtype",
    )
    assert kv.severity == WARNING and "quantization config decides" in kv.found


def test_kv_cache_dtype_auto_without_a_target_path_is_unresolved(tiny):
    prefill = without(launch(tiny, "prefill", "--kv-cache-dtype", "auto"), "--model-path")
    f = only(pair(tiny, prefill, launch(tiny, "decode", "--kv-cache-dtype", "bf16")), "pd-kv-cache-dtype")
    assert f.severity == WARNING and "quantization config decides" in f.found


@pytest.mark.parametrize(
    "quantization, inside_text_config",
    [
        ({"kv_cache_quant_algo": "FP8"}, False),
        ({"quant_method": "modelopt_fp4"}, False),
        ({"quant_method": "petit_nvfp4"}, False),
        ({"quant_method": "modelopt"}, True),
    ],
    ids=["kv-cache-quant-algo", "modelopt", "petit", "in-text-config"],
)
def test_each_quantization_that_may_choose_an_fp8_kv_cache_leaves_auto_unresolved(
    tiny, make_target, quantization, inside_text_config
):
    config = (
        {"text_config": {"quantization_config": quantization}}
        if inside_text_config
        else {"quantization_config": quantization}
    )
    quantized = make_target("kimi_k25", config=config)

    def side(name: str, *extra: str) -> str:
        return launch(tiny, name, *extra).replace(str(tiny["kimi_k25"]), str(quantized))

    f = only(pair(tiny, side("prefill"), side("decode", "--kv-cache-dtype", "bf16")), "pd-kv-cache-dtype")
    assert f.severity == WARNING and "quantization config decides" in f.found


def test_a_flag_compared_as_given_says_the_fix_that_fits_it(tiny):
    context = only(
        pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", "--context-length", "8192")), "pd-context-length"
    )
    assert context.fix == "give both servers the same --context-length"
    pages = only(
        pair(tiny, launch(tiny, "prefill", "--page-size", "1"), launch(tiny, "decode", "--page-size", "64")),
        "pd-page-size",
    )
    assert pages.fix.startswith("give both servers the same --page-size (and --attention-backend")


def test_a_side_given_as_parsed_launch_args_or_an_argument_list_is_judged_alike(tiny):
    from eagle3_patches.checkpoint.launch_args import parse_launch_args

    p, d = launch(tiny, "prefill"), launch(tiny, "decode", "--context-length", "8192")
    as_text = pair(tiny, p, d)
    assert codes(pair(tiny, parse_launch_args(p), parse_launch_args(d))) == codes(as_text) == {"pd-context-length"}
    assert codes(pair(tiny, shlex.split(p), shlex.split(d))) == codes(as_text)


@pytest.mark.parametrize("empty", ["   ", ["", "  "]], ids=["blank", "blank-arguments"])
def test_a_blank_command_is_an_empty_one(tiny, empty):
    from eagle3_patches.checkpoint.launch_args import LaunchArgsError

    with pytest.raises(LaunchArgsError, match="the decode server's launch command is empty"):
        pair(tiny, launch(tiny, "prefill"), empty)
