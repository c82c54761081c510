"""The doctor on a disaggregated prefill/decode pair (``eagle3-patches doctor --prefill CMD --decode CMD``): silent
on a pair that agrees, each disagreement named with both sides, each side's own findings kept with its side."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from eagle3_patches.checkpoint.digest import checkpoint_digest
from eagle3_patches.diagnostic import ERROR, WARNING
from eagle3_patches.doctor import doctor_pair


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
    import torch

    other = make_draft("other", tensors=lambda t: t.update({"fc.weight": t["fc.weight"] + torch.ones(())}))
    f = only(pair(tiny, launch(tiny, "prefill"), launch(tiny, "decode", draft=other)), "pd-draft")
    assert f.severity == ERROR and str(tiny["draft"]) in f.found and str(other) in f.found


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
        (lambda c: without(c, "--speculative-num-draft-tokens"), "pd-speculative-flags", WARNING),
        (lambda c: c + " --speculative-adaptive", "pd-speculative-flags", ERROR),
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
        "draft-tokens-one-side",
        "adaptive",
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
